"""Hierarchies of reward machines on GrandTour (Tour's six touches three times over, 18 in one episode), over
training seeds: the option learner of configs/hrm_tour_options.yaml on the hierarchy of tasks/grand_tour.rm
(root -> lap -> touch), PPO on its flat machine with shaping (configs/hrm_tour_flat.yaml) and PPO on the
task's sparse reward (configs/ppo_tour_sparse.yaml), each with Tour's env-step budget (bench/hrm.py) and the
same overrides: `env.id=mujoco/GrandTour`, and the grand tour's hierarchy for the two machine learners.

The option learner learns Tour's three touch options whatever the number of laps; the flat learner must learn
each of the flat machine's 37 configurations (Tour's has 13), reaching the last only once the 17 touches before
it are done. Prints the table of bench/hrm.py and writes `docs/results/hrm_grand_tour.{json,md,png}`.

Usage: python bench/hrm_grand_tour.py [--run-dir runs/hrm_grand_tour] [--seeds 0 1 2] [--steps 1200000]
       [--jobs 1] [--reuse]
About 25 minutes on 2 CPU cores with the defaults (nine runs of 2 to 4 minutes, one after the other).
"""
from __future__ import annotations

from hrm import study
from study import seeds_study_parser

GRAND_TOUR = ["env.id=mujoco/GrandTour"]
HIERARCHY = ["env.rm.machine=tasks/grand_tour.rm"]
LEARNERS = {"options (HRM), one actor per machine": ("hrm_tour_options", GRAND_TOUR + HIERARCHY),
            "flat machine": ("hrm_tour_flat", GRAND_TOUR + HIERARCHY),
            "sparse reward": ("ppo_tour_sparse", GRAND_TOUR)}


def main() -> None:
    args = seeds_study_parser(__doc__.splitlines()[0], "runs/hrm_grand_tour", 1_200_000).parse_args()
    study(LEARNERS, args, "hrm_grand_tour",
          "Hierarchies of reward machines on GrandTour (Tour three times over, 18 touches)",
          "GrandTour: option learner vs flat machine vs sparse reward (mean over seeds)", f"{args.steps:,} env steps")


if __name__ == "__main__":
    main()
