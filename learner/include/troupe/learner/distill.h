// On-policy distillation terms of the GRPO loss (distill.*, learner/README.md "On-policy
// distillation"): the per-token reverse-KL advantage against a frozen teacher's log-probs, and the
// teacher's top-k forward-KL term. Invariant: the teacher's numbers are constants (no gradient);
// every gradient flows through the student's log-probs, each weighted by the loss's aggregation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/base/result.h"
#include "troupe/learner/config.h"
#include "troupe/policy/io/tokenizer.h"

namespace troupe::learner {

// Metric sums of the distillation terms (add across micro-batches and ranks; means per token).
struct DistillSums {
  double tokens = 0;             // sum of mask over tokens with a teacher log-prob
  double reverse_kl_sum = 0;     // sum_t m_t (log p_student - log p_teacher) of the sampled token
  double teacher_logp_sum = 0;   // sum_t m_t log p_teacher
  double loss = 0;               // the reverse-KL term's share of the loss (globally normalised)
  double topk_kl_sum = 0;        // sum_t m_t sum_j p_T(j) (log p_T(j) - log p_S(j)) over the top k
  double topk_loss = 0;          // the top-k term's share of the loss (globally normalised)
  void add(const DistillSums& o);
};

// The reverse-KL term over n positions. Per position t with mask m_t > 0:
//   A_t    = coef * (teacher_logp_t - logp_t)          (detached: a per-token advantage)
//   rho_t  = exp(logp_t - logp_old_t)                   (1 when logp_old is null: on-policy)
//   loss  += -weight_t * A_t * rho_t                    (weight_t: the aggregation weight, mask included)
//   dlogp += -weight_t * A_t * rho_t                    (added to what dlogp holds)
// The policy-gradient estimator of coef * KL(student || teacher) on the student's own samples
// (the importance-sampling loss of the on-policy distillation recipes).
void distill_reverse_kl(float* dlogp, const float* logp, const float* teacher_logp, const float* logp_old,
                        const float* mask, const double* weight, int n, float coef, DistillSums& sums);

// The top-k forward-KL term over n positions of k rows each (position t's row j at t * k + j):
// student_logp the student's log-prob of the teacher's j-th most likely token,
// teacher_logp its teacher log-prob (p_T = exp of it, not renormalised over the k):
//   loss  += coef * weight_t * sum_j p_T(j) (teacher_logp_j - student_logp_j)
//   dstudent_logp_j = -coef * weight_t * p_T(j)        (assigned)
void distill_topk_forward_kl(float* dstudent_logp, const float* student_logp, const float* teacher_logp,
                             const float* mask, const double* weight, int n, int k, float coef, DistillSums& sums);

// A fingerprint of a tokenizer: xxh3-64 over its kind, special ids and the text of every id, as
// "xxh3:<16 hex digits>". Two tokenizers with the same fingerprint map text to the same ids.
std::string tokenizer_fingerprint(const policy::io::Tokenizer& tok);

// distill.teacher must share the student's tokenizer (the teacher scores the student's token ids):
// an invalid_input error naming both models and both fingerprints otherwise.
Status check_distill_tokenizers(const policy::io::Tokenizer& student, const std::string& student_name,
                                const policy::io::Tokenizer& teacher, const std::string& teacher_name);
// The same check by fingerprints (a teacher on a scorer reports only its tokenizer's).
Status check_distill_tokenizer_hashes(const std::string& student_hash, const std::string& student_name,
                                      const std::string& teacher_hash, const std::string& teacher_name);

}  // namespace troupe::learner
