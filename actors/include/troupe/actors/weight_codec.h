// The weight-sync codec: how learner 0's weights become a Weights message (messages.h) and how a
// generator applies one. The generators hold their weights in a dtype (fp32: the master as is;
// bf16: each value rounded to the nearest bf16, ties to even, kept as an fp32 whose low 16 bits
// are zero, so every kernel still computes in fp32). A sync is full (every value's bits) or a delta
// (the XOR of the new bits and those of the version the receiver holds, zstd-compressed per chunk:
// bf16, where a small update changes few values, as the gaps between changed values and their
// XORs' byte planes; fp32, where it changes the low bytes of nearly all, as the byte planes of
// every XOR). A delta's chunks follow the tensors when the table tiles the arena, so each side
// hashes a tensor in the pass that encodes or applies it. Every tensor carries an xxh3-64 checksum
// of its values as the receiver must hold them; a receiver that gets anything else keeps what it had.
// The probe: log-probs of a fixed token sequence, which the generator computes with its weights
// and compares bit for bit with learner 0's (docs/weight_sync.md).
// Its parts: weight_format.h (dtypes, encodings, statuses, checksums), weight_encoder.h (learner
// 0), weight_decoder.h (a generator), weight_probe.h; this header includes them all.
#pragma once

#include "troupe/actors/weight_decoder.h"
#include "troupe/actors/weight_encoder.h"
#include "troupe/actors/weight_format.h"
#include "troupe/actors/weight_probe.h"
