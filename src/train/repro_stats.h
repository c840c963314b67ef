// The statistics every reproduction reports: paired differences by seed with Student-t 95 %
// intervals (n - 1 degrees of freedom), the verdict they allow, the smallest effect that n could
// have detected, least-squares fits with coefficient intervals (the U-shape test), and the
// well-trained-arm rule that withholds verdicts from runs still on or near the initial plateau.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace mf {

// The p-quantile of Student's t with `dof` degrees of freedom (dof >= 1, 0 < p < 1).
double student_t_quantile(double p, int64_t dof);
// Its distribution function.
double student_t_cdf(double t, int64_t dof);

// Mean and standard error of the per-seed differences a[s] - b[s] and the two-sided 95 %
// interval mean ± t(0.975, n-1) se. "held" when the interval excludes 0 on the side the
// direction expects (want_positive: above 0), "did not hold" when it excludes 0 on the other,
// else "not resolved at this scale". half_width() is also the smallest true difference this n
// and this spread would have resolved (its minimum detectable effect, at the 50 % power the
// interval's own edge gives).
// The same numbers serve any estimate with a t interval (a fitted coefficient: mean = the
// estimate, seeds = the observations, dof = its residual degrees of freedom).
struct PairedDifference {
  double mean = 0, se = 0;
  size_t seeds = 0;  // fewer than 2: nothing is resolved
  int64_t dof = -1;  // -1: seeds - 1
  int64_t degrees() const { return dof >= 0 ? dof : static_cast<int64_t>(seeds) - 1; }
  double half_width() const;
  double lo() const { return mean - half_width(); }
  double hi() const { return mean + half_width(); }
  std::string call(bool want_positive) const;
};
PairedDifference paired_difference(const std::vector<double>& a, const std::vector<double>& b);
// From a stored mean, standard error and n (a results.json rendered again).
PairedDifference paired_from(double mean, double se, size_t seeds, int64_t dof = -1);

// What the paper reports for a direction, in the direction's own units and sign convention.
struct PaperEffect {
  double value = 0;
  std::string where;  // "Table 5, 182M" ...
};

// One direction of a results file, chosen before running: primary (a headline) or secondary.
struct Direction {
  std::string text;
  bool want_positive = true;
  bool primary = false;
  std::optional<PaperEffect> paper;
  std::string unit;
  double scale = 1;  // printed as scale x the difference
  int digits = 4;
};

// The direction with its numbers as results.json keeps them:
// {text, want_positive, primary, difference, se, seeds, dof, ci: [lo, hi], detectable, call, paper?},
// and "early" ({difference, se, seeds, dof}: the same direction from the held-out losses at 80 % of
// the steps) where the driver adds it.
nlohmann::json direction_json(const Direction& d, const PairedDifference& p);
// An arm's per-seed values under `key` in results.json ({} when it has none).
std::vector<double> seed_values(const nlohmann::json& arm, const std::string& key);
// One markdown line for a direction_json entry, the verdict recomputed from its numbers (a stale
// call in the file cannot survive a re-render), or no verdict with the reason `withheld`:
// "- **[primary]** TEXT: +0.0123 (95 % CI +0.0010 to +0.0236, n = 5; detectable at this n: ±0.0113);
//  paper: +0.0288 (Table 5) → **held**".
// `still_falling` (some run's loss still fell fast at the end): a held / did-not-hold verdict
// stands only where the 80 % value ("early") gives the same one, so the ranking is not one that
// formed while the runs were still falling; "not resolved" stands as it is.
std::string direction_line(const nlohmann::json& d, const std::string& withheld = "", bool still_falling = false);
// The verdict direction_line shows, as a word: "held", "did not hold", "not resolved at this
// scale" or "no verdict" (withheld, or a still-falling call that 80 % of the steps does not repeat).
std::string shown_call(const nlohmann::json& d, bool withheld = false, bool still_falling = false);

// Ordinary least squares y ~ X (rows of X are the regressors of one observation) with each
// coefficient's standard error and t interval on n - p degrees of freedom.
struct LeastSquares {
  std::vector<double> coef, se;
  int64_t dof = 0;
  double half_width(size_t i) const;
};
LeastSquares least_squares(const std::vector<std::vector<double>>& X, const std::vector<double>& y);

// Whether a run may carry a verdict: its validation loss is at least `margin` nats below the
// corpus's unigram entropy (off the initial plateau), and its training loss fell by at most
// `max_fall` (relative) over the last 20 % of its steps (the least-squares slope of the losses
// there, times that span, over their mean: the validation losses where there are at least 3,
// else the logged training losses). Empty when well trained, else why not.
struct TrainingHealth {
  double val_loss = 0, unigram = 0, late_fall = 0;  // late_fall: relative drop over the last 20 %
  std::string problem;
  std::string kind;  // of the problem: "plateau", "few_losses", "falling" (late_fall > max_fall) or ""
};
TrainingHealth training_health(const std::string& run_dir, double margin = 0.5, double max_fall = 0.02);

// The held-out loss (val_loss_mean) of a run's last evaluation at or before `fraction` of its
// steps, NaN where it has none: a direction computed from these says whether the final ranking
// was already there earlier in training.
double held_out_loss_at(const std::string& run_dir, double fraction);

}  // namespace mf
