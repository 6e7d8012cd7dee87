"""Option learners on Tour (touch red, blue, red, yellow, red, blue), over training seeds: SAC learning the
hierarchy of tasks/tour.rm by options with counterfactual experience across options
(configs/hrm_tour_options_sac.yaml, `sac.crm: true`) and without it (`sac.crm=false`), each with the same
env-step budget; and PPO's option learner with one actor per machine (configs/hrm_tour_options.yaml, whose
default `policy.actors: per_machine` the override spells out) at PPO's budget.

Prints, per learner, the final deterministic eval success over the seeds (mean with a 95% bootstrap CI, IQM
from 5 seeds), the seeds that reach 80%, the median env steps and minutes to 80%, and each seed's result.
Writes `docs/results/hrm_variants.{json,md,png}`.

Usage: python bench/hrm_variants.py [--run-dir runs/hrm_variants] [--seeds 0 1 2] [--jobs 2] [--reuse]
Each learner trains for its config's `train.total_steps` (SAC 150,000, PPO 1,200,000) unless --steps is given.
About 70 minutes on 2 CPU cores with --jobs 2.
"""
from __future__ import annotations

from hrm import study
from study import seeds_study_parser

LEARNERS = {
    "SAC options + counterfactual experience": ("hrm_tour_options_sac", []),
    "SAC options": ("hrm_tour_options_sac", ["sac.crm=false"]),
    "PPO options, one actor per machine": ("hrm_tour_options", ["policy.actors=per_machine"]),
}


def main() -> None:
    args = seeds_study_parser(__doc__.splitlines()[0], "runs/hrm_variants", 0).parse_args()
    study(LEARNERS, args, "hrm_variants", "Option learners on Tour: counterfactual experience, one actor per machine",
          "Tour: option learner variants (mean over seeds)",
          f"{args.steps:,} env steps" if args.steps else "its config's train.total_steps env steps")


if __name__ == "__main__":
    main()
