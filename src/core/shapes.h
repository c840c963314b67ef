// The one shape legend. A tensor's name ends in the letters of its dimensions, outermost first
// (x_TD, logits_TE, gate_EOI); a digit is a literal size (qkv_BL3HDh: q, k, v) and Dh is the one
// two-letter dimension. Every letter has one meaning across src/ and tests/; a paper's own
// letters stay in the formulas its comments quote, and its header says how they map.
// A [folder] after an entry keeps the letter to those folders of src/ and tests/, so it cannot
// take a second meaning elsewhere; tests/check_shape_letters.py fails on a letter used outside
// them or not defined here.
//
//   A  IntBMoE's expert bases (every block mixes all of them)  [methods/intb]
//   B  samples in a batch or split: sequences, or images
//   C  IntBMoE's codebook width (a block's code)  [methods/intb]
//   D  width of the rows a layer works on: the model width (the latent width inside a latent bank)
//   Dh one attention head's width  [model serve]
//   E  units (experts) a router chooses among; IntBMoE's blocks, UniPool's pool
//   F  hidden width of one expert
//   G  blocks of one expert (ExpertBlocks; UniF-MoE's formulas call them B)  [methods/unif moe]
//   H  attention heads  [model serve]
//   I  input width of one IntBMoE internal layer  [methods/intb]
//   J  UniF-MoE's experts with the shared one first (Q + 1)  [methods/unif]
//   K  units per token (top-k)
//   L  tokens of one sample (a sequence, or an image's patches)
//   M  hidden width of one unit (F, or F / G for expert blocks)
//   N  a unit's first-layer outputs (M; 2M for SwiGLU), padded
//   O  output width of one IntBMoE internal layer  [methods/intb]
//   P  routed (token, unit) pairs (T * K for top-k; varies for top-p)
//   Q  UniF-MoE's residual experts (its formulas' K)  [methods/unif]
//   R  IntBMoE's hypernetwork width  [methods/intb]
//   S  width of a bank's per-token side input
//   T  tokens in the batch (rows of x; B * L)
//   U  units a bank computes: E experts, or E * G (expert, block) units
//   V  vocabulary entries
//   W  ranks of a process group (the world)  [dist]
//   X  image columns  [data model]
//   Y  image rows  [data model]
//   Z  LatentMoE's latent width where the model width D appears beside it  [methods/latent]
#pragma once
