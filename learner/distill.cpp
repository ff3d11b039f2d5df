// On-policy distillation terms (distill.h): the reverse-KL advantage per sampled token and the
// teacher's top-k forward-KL term, both as gradients of the student's log-probs, and the
// tokenizer check that refuses a teacher whose ids mean other text than the student's.
#include "troupe/learner/distill.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <string>

namespace troupe::learner {

void DistillSums::add(const DistillSums& o) {
  tokens += o.tokens;
  reverse_kl_sum += o.reverse_kl_sum;
  teacher_logp_sum += o.teacher_logp_sum;
  loss += o.loss;
  topk_kl_sum += o.topk_kl_sum;
  topk_loss += o.topk_loss;
}

void distill_reverse_kl(float* dlogp, const float* logp, const float* teacher_logp, const float* logp_old,
                        const float* mask, const double* weight, int n, float coef, DistillSums& sums) {
  for (int t = 0; t < n; ++t) {
    const double m = mask[t];
    if (m == 0) continue;
    const double lp = logp[t], tl = teacher_logp[t];
    const double adv = static_cast<double>(coef) * (tl - lp);
    const double rho = logp_old ? std::exp(lp - static_cast<double>(logp_old[t])) : 1.0;
    const double g = -weight[t] * adv * rho;
    dlogp[t] = static_cast<float>(static_cast<double>(dlogp[t]) + g);
    sums.loss += g;
    sums.tokens += m;
    sums.reverse_kl_sum += m * (lp - tl);
    sums.teacher_logp_sum += m * tl;
  }
}

void distill_topk_forward_kl(float* dstudent_logp, const float* student_logp, const float* teacher_logp,
                             const float* mask, const double* weight, int n, int k, float coef, DistillSums& sums) {
  for (int t = 0; t < n; ++t) {
    const double m = mask[t];
    double kl = 0;
    for (int j = 0; j < k; ++j) {
      const size_t i = static_cast<size_t>(t) * static_cast<size_t>(k) + static_cast<size_t>(j);
      const double pt = std::exp(static_cast<double>(teacher_logp[i]));
      dstudent_logp[i] = m == 0 ? 0.0f : static_cast<float>(-static_cast<double>(coef) * weight[t] * pt);
      kl += pt * (static_cast<double>(teacher_logp[i]) - student_logp[i]);
    }
    if (m == 0) continue;
    sums.topk_kl_sum += m * kl;
    sums.topk_loss += static_cast<double>(coef) * weight[t] * kl;
  }
}

std::string tokenizer_fingerprint(const policy::io::Tokenizer& tok) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  auto feed = [&](const std::string& s) {
    const uint64_t len = s.size();
    XXH3_64bits_update(st, &len, sizeof len);
    XXH3_64bits_update(st, s.data(), s.size());
  };
  feed(tok.kind());
  const int32_t ids[4] = {tok.bos_id(), tok.eos_id(), tok.pad_id(), tok.vocab_size()};
  XXH3_64bits_update(st, ids, sizeof ids);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    auto text = tok.decode({id});
    feed(text.ok() ? *text : std::string("\x01<no text>"));
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char buf[32];
  std::snprintf(buf, sizeof buf, "xxh3:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Status check_distill_tokenizer_hashes(const std::string& student_hash, const std::string& student_name,
                                      const std::string& teacher_hash, const std::string& teacher_name) {
  if (student_hash == teacher_hash) return {};
  return invalid_input("distill.teacher: the teacher " + teacher_name + " has another tokenizer than the student " +
                       student_name + " (teacher tokenizer " + teacher_hash + ", student tokenizer " + student_hash +
                       "): on-policy distillation scores the student's token ids with the teacher, so both must "
                       "share one tokenizer");
}

Status check_distill_tokenizers(const policy::io::Tokenizer& student, const std::string& student_name,
                                const policy::io::Tokenizer& teacher, const std::string& teacher_name) {
  return check_distill_tokenizer_hashes(tokenizer_fingerprint(student), student_name + " (" + student.kind() + ", " +
                                            std::to_string(student.vocab_size()) + " ids)",
                                        tokenizer_fingerprint(teacher), teacher_name + " (" + teacher.kind() + ", " +
                                            std::to_string(teacher.vocab_size()) + " ids)");
}

}  // namespace troupe::learner
