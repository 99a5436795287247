"""The RL recipe study: which settings let RL raise the held-out success of the cloned LIBERO-Spatial
policy at a CPU budget. Every variant is the main job's recipe (``configs/libero_spatial_grpo.json``)
with some settings changed; all start from the same cloned policy.

    python -m benchmarks.rl_recipe_study                          # every variant, seed 0 (hours)
    python -m benchmarks.rl_recipe_study --variants recipe --seeds 0 1 2
    python -m benchmarks.rl_recipe_study --variants recipe --steps 2000 --eval-init-states 40  # smoke
    python -m benchmarks.rl_recipe_study --define '{"mine": {"grpo": {"learning_rate": 1e-3}}}'
    python -m benchmarks.rl_recipe_study --variants recipe-long --curve-every 4
    python -m benchmarks.rl_recipe_study --variants recipe sac-rlpd-weak --seeds 0 1 2 --placebo
    python -m benchmarks.rl_recipe_study --variants grpo-weak-60k --seeds 0 1 --placebo --curve-every 5
    python -m benchmarks.rl_recipe_study --recipe configs/libero_spatial_sac.json --seeds 0 1 2 --placebo \
        --variants sac-rlpd-weak clone-rlpd-30min sac-rlpd-from-clone      # RL against imitation alone
    python -m benchmarks.rl_recipe_study --recipe configs/libero_spatial_sac.json --variants A B \
        --train-init-states $(seq 0 29) --eval-init-states $(seq 30 39)    # choose without 40-49

For each variant and seed the recipe trains for its env-step budget (``--steps`` overrides it)
without in-run held-out evaluation; then the final policy plays every held-out (task, init state)
pair of the recipe's evaluation env once, deterministically, rendering off. Each starting policy (the
recipe's ``init_policy``, or a variant's own) is evaluated once on the same pairs and kept in
``before-<name>.json`` (its deterministic actions are the starting point; a residual policy starts at
exactly its base's).

Sampled success on a fixed set of training starts: every task of the training env x the training
init states ``--sampled-init-states`` (default 0 and 1: 20 pairs on LIBERO-Spatial), one episode
each with sampled (not deterministic) actions, played by the run itself before training, every
``--sampled-every`` iterations and at the end (a second ``trainers.callbacks.Evaluation``, in the
run's ``sampled_episodes.jsonl``; its sampling has a stream of its own, so the run trains as it
would without it, and every evaluation of a run draws the same noise). The same starts at every
point, unlike the training episodes, whose starts change every iteration. The train minutes
include these evaluations.

Controls beside the placebo: ``clone-*`` variants are imitation alone (``trainers.bc`` continuing
the start policy on the same prior data for a main-job run's wall time, ``max_minutes``), and
``*-from-clone`` variants the RL recipe started from that longer clone of the same seed. A second
table pools seeds: each variant against its placebo and the clones on the same (seed, pair)s, with
the exact McNemar test (``--compare A B`` for other pairs).

One table: training budget and wall clock, the sampled success on the fixed training starts before
-> after training, held-out success before and after with 95% Wilson intervals, and the exact
McNemar test on the pairs whose outcome changed. Plus ``learning_curves.png`` (the sampled success on
the fixed training starts against env steps) and ``rl_recipe_study.json`` (with each iteration's
training-episode success too). ``--curve-every N`` also has the run evaluate every held-out pair
every N iterations (``held_out_curves.png``; the train minutes then include those evaluations). A
finished (variant, seed) keeps its ``result.json`` under ``--out`` and is reused when the study runs
again (``--fresh`` retrains; so does a result without the sampled curve on the same fixed starts);
``--report`` trains nothing and tabulates every finished run under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.report import plot_lines, table, write_json
from nets.errors import BadInput, program_name, run_cli
from trainers.metrics import mcnemar_p, wilson_interval

# name -> what it is, the algorithm, and the recipe settings it changes ("run" / algorithm sections)
# (each names what it needs beyond the recipe, so a later recipe change does not silently change it)
_EXPLORE = {"log_std_bounds": [-20.0, -1.5], "noise_dims": [0, 1, 2, 5, 6]}  # rotations held still
_PLAIN_GRPO = {"learning_rate": 3e-5, "n_epochs": 2, "target_kl": None, "sil_coef": 0.0}
WEAK_CLONE = "checkpoints/bc_libero_spatial_state_weak.pt"  # see checkpoints/README.md
SAMPLED = "sampled"  # the runs' evaluation of the fixed training starts: sampled_episodes.jsonl
# SAC from prior data: configs/libero_spatial_sac.json (its prior data, 400 expert episodes from the
# training starts only, ships as data/libero_spatial_expert_train.h5; python -m trainers.demos --config
# configs/libero_spatial_demos.json makes it again: data/README.md)
SAC_RECIPE = json.loads(
    (Path(__file__).resolve().parents[1] / "configs" / "libero_spatial_sac.json").read_text()
)
DSRL_RECIPE = json.loads(
    (Path(__file__).resolve().parents[1] / "configs" / "libero_spatial_dsrl.json").read_text()
)
# self-imitation from a 20-demo clone: configs/libero_spatial_sil.json (its demos ship as
# data/libero_spatial_expert_20.h5, its start as checkpoints/flow_libero_spatial_20demos_e6000.pt)
SIL_RECIPE = json.loads(
    (Path(__file__).resolve().parents[1] / "configs" / "libero_spatial_sil.json").read_text()
)
# the imitation control's BC settings (the clones' own: checkpoints/README.md), stopped by max_minutes
LONGER_CLONE = {
    "demos": SAC_RECIPE["sac"]["prior_data"],
    "epochs": 100_000,
    "batch_size": 512,
    "learning_rate": 1e-3,
}
FEW_DEMOS = "data/libero_spatial_expert_20.h5"  # 2 expert episodes per task
FEW_DEMO_CLONE = "checkpoints/flow_libero_spatial_20demos.pt"  # its flow clone at imitation's plateau
FEW_DEMO_EARLY = "checkpoints/flow_libero_spatial_20demos_e6000.pt"  # that clone's first stage (6,000 epochs)
ONE_DEMO = "data/libero_spatial_expert_10.h5"  # 1 expert episode per task (init state 0)
ONE_DEMO_EARLY = "checkpoints/flow_libero_spatial_10demos_e6000.pt"  # its flow clone, 6,000 epochs
# self-imitation (trainers/sil) for 30 minutes with the 20 demos as half of every minibatch
_SIL_RUN = {"policy": "auto", "total_steps": 10_000_000, "max_minutes": 30.0, "torch_threads": 1}
_RECIPE_RUN = (*_SIL_RUN, "init_policy", "loop")  # the shipped recipe's run settings a variant keeps
_SIL = {
    "prior_data": FEW_DEMOS,
    "prior_ratio": 0.5,
    "steps_per_iteration": 8,
    "updates_per_iteration": 64,
    "batch_size": 512,
    "learning_rate": 1e-3,
    "ema_decay": 0.999,
}
# the longer clone of a 20-demo start: BC with the weight average on the same 20 demos for 30 minutes
_FEW_DEMO_BC = {**LONGER_CLONE, "demos": FEW_DEMOS, "ema_decay": 0.999, "val_fraction": 0.0}
_CLONE_RUN = {"policy": "auto", "max_minutes": 30.0, "torch_threads": 1}
VARIANTS: dict[str, dict[str, Any]] = {
    "recipe": {"about": "the main job's recipe as it is", "algo": "grpo"},
    "recipe-long": {
        "about": "the recipe for 40k env steps (with --curve-every: where the gain goes)",
        "run": {"total_steps": 40_000},
    },
    "grpo-clone-std": {
        "about": "plain GRPO, noise on every dim, std in [e^-3, e^-1.5], lr 3e-5, 2 epochs, 50k steps",
        "run": {"total_steps": 50_000, "policy_kwargs": {"log_std_bounds": [-3.0, -1.5], "noise_dims": None}},
        "grpo": _PLAIN_GRPO,
    },
    "grpo-explore-lr1e-4": {
        "about": "plain GRPO, no noise on the held-still rotations, std <= e^-1.5, lr 1e-4, 50k steps",
        "run": {"total_steps": 50_000, "policy_kwargs": _EXPLORE},
        "grpo": {**_PLAIN_GRPO, "learning_rate": 1e-4},
    },
    "residual-lr3e-4": {
        "about": "residual MLP over the frozen clone, same noise, plain GRPO, lr 3e-4, 50k steps",
        "run": {"total_steps": 50_000, "policy": "residual", "policy_kwargs": _EXPLORE},
        "grpo": {**_PLAIN_GRPO, "learning_rate": 3e-4},
    },
    "ppo-critic-warmup": {
        "about": "PPO + critic (3 warm-up iterations), chunk-level GAE, lr 1e-4, 50k steps",
        "algo": "ppo",
        "run": {"total_steps": 50_000, "policy_kwargs": _EXPLORE},
        "ppo": {
            "n_steps": 16,
            "batch_size": 64,
            "n_epochs": 4,
            "learning_rate": 1e-4,
            "time_unit": "chunk",
            "log_prob_level": "element",
            "gamma": 0.99,
            "gae_lambda": 0.95,
            "critic_warmup_iters": 3,
        },  # fmt: skip
    },
    "grpo-sil-50k": {
        "about": "the recipe settings (target_kl 0.8 per chunk-step, 4 epochs, self-imitation 1), 50k steps",
        "run": {"total_steps": 50_000},
    },
    "weak-clone": {
        "about": "the recipe from a weaker clone (120 BC epochs on 200 demos of init states 0-39 only)",
        "run": {"init_policy": WEAK_CLONE},
    },
    "weak-clone-long": {
        "about": "weak-clone for 40k env steps (with --curve-every: where the gain goes)",
        "run": {"init_policy": WEAK_CLONE, "total_steps": 40_000},
    },
    "grpo-weak-60k": {
        "about": "the fixed GRPO recipe from the weak clone at the SAC recipes' budget (60k env steps)",
        "run": {"init_policy": WEAK_CLONE, "total_steps": 60_000},
    },
    "sac-rlpd-weak": {
        "about": "configs/libero_spatial_sac.json: SAC from the weak clone with prior demos (RLPD: half of "
        "each batch, 1000 offline steps, BC 0.1), chunk critic, 4-chunk returns, alpha 1e-5, std <= e^-1.5",
        "algo": "sac",
        "run": {
            **{k: SAC_RECIPE["run"][k] for k in ("init_policy", "total_steps", "torch_threads")},
            "policy_kwargs": {"noise_dims": None, **SAC_RECIPE["run"]["policy_kwargs"]},  # every dim explores
        },
        "sac": SAC_RECIPE["sac"],
    },
    "sac-rlpd-weak-std": {
        "about": "sac-rlpd-weak with actor and critics standardised by the prior data's statistics (the "
        "clone's raw inputs folded into its first layer: critic_obs_norm, actor_obs_norm 'prior')",
        "algo": "sac",
        "run": {
            **{k: SAC_RECIPE["run"][k] for k in ("init_policy", "total_steps", "torch_threads")},
            "policy_kwargs": {"noise_dims": None, **SAC_RECIPE["run"]["policy_kwargs"]},
        },
        "sac": {**SAC_RECIPE["sac"], "critic_obs_norm": "prior", "actor_obs_norm": "prior"},
    },
    "dsrl-flow": {
        "about": "configs/libero_spatial_dsrl.json: DSRL, SAC on the initial noise of the frozen flow clone "
        "(noise in [-1, 1], 5 critics, target min of 2, learned alpha), no prior data",
        "algo": "sac",
        "run": {
            k: DSRL_RECIPE["run"][k]
            for k in ("policy", "init_policy", "policy_kwargs", "total_steps", "torch_threads")
        },
        "sac": DSRL_RECIPE["sac"],
    },
    # -- controls: imitation alone on the same prior data for a main-job run's wall time, and the RL
    # recipe started from that longer clone (RL earns its place only where it beats both)
    "clone-rlpd-30min": {
        "about": "imitation alone: the weak clone trained further by BC on the RLPD recipe's prior data "
        "(its 394 expert episodes) for 30 minutes, a main-job run's wall time",
        "algo": "bc",
        "run": {"policy": "auto", "init_policy": WEAK_CLONE, "max_minutes": 30.0, "torch_threads": 0},
        "bc": LONGER_CLONE,
    },
    "sac-rlpd-from-clone": {
        "about": "sac-rlpd-weak started from clone-rlpd-30min of the same seed",
        "algo": "sac",
        "start_from": "clone-rlpd-30min",
        "run": {
            **{k: SAC_RECIPE["run"][k] for k in ("total_steps", "torch_threads")},
            "policy_kwargs": {"noise_dims": None, **SAC_RECIPE["run"]["policy_kwargs"]},
        },
        "sac": SAC_RECIPE["sac"],
    },
    "clone-flow-30min": {
        "about": "imitation alone: the DSRL recipe's flow clone trained further by BC (flow matching) on the "
        "same prior data for 30 minutes",
        "algo": "bc",
        "run": {
            "policy": "auto",
            "init_policy": DSRL_RECIPE["run"]["init_policy"],
            "max_minutes": 30.0,
            "torch_threads": 0,
        },
        "bc": LONGER_CLONE,
    },
    "dsrl-from-clone": {
        "about": "dsrl-flow steering clone-flow-30min of the same seed",
        "algo": "sac",
        "start_from": "clone-flow-30min",
        "run": {
            k: DSRL_RECIPE["run"][k] for k in ("policy", "policy_kwargs", "total_steps", "torch_threads")
        },
        "sac": DSRL_RECIPE["sac"],
    },
    # -- DSRL on the async actor-learner (--loop async), a critic step per chunk and vector step
    # ("utd1", RLinf-like budgets of env steps) or four ("utd4"); the actor steps every 16th update
    "dsrl-async-utd1": {
        "about": "dsrl-flow on the async loop: 140k env steps, 16 updates per vector step of 16 envs, the "
        "noise actor stepped on every 16th",
        "algo": "sac",
        "run": {
            **{k: DSRL_RECIPE["run"][k] for k in ("policy", "init_policy", "policy_kwargs", "torch_threads")},
            "total_steps": 140_000,
            "loop": "async",
        },
        "sac": {**DSRL_RECIPE["sac"], "gradient_steps": 16, "actor_every": 16},
    },
    "dsrl-async-utd4": {
        "about": "dsrl-flow on the async loop: 100k env steps, 64 updates per vector step of 16 envs (4 per "
        "chunk), the noise actor stepped on every 16th",
        "algo": "sac",
        "run": {
            **{k: DSRL_RECIPE["run"][k] for k in ("policy", "init_policy", "policy_kwargs", "torch_threads")},
            "total_steps": 100_000,
            "loop": "async",
        },
        "sac": {**DSRL_RECIPE["sac"], "gradient_steps": 64, "actor_every": 16},
    },
    # -- self-imitation from success (trainers/sil) from a few-demo clone at imitation's plateau, and the
    # longer clone of it: imitation alone on the same 20 demos for the same wall time
    "sil-20demos": {
        "about": "trainers.sil for 30 min from the 20-demo flow clone at its plateau: 64 updates of batch "
        "512 (half the 20 demos, half the kept successes) per 8 vector steps, weight average 0.999",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_CLONE},
        "sil": _SIL,
    },
    "clone-20demos-30min": {
        "about": "imitation alone: the 20-demo flow clone trained further by BC (weight average 0.999) on "
        "the same 20 demos for 30 minutes",
        "algo": "bc",
        "run": {**_CLONE_RUN, "init_policy": FEW_DEMO_CLONE},
        "bc": _FEW_DEMO_BC,
    },
    # -- the same pair from the clone's first stage (before its weight average): a start that more
    # imitation still lifts, so the longer clone is the control to beat
    "sil-20demos-e6000": {
        "about": "sil-20demos from the 20-demo clone's first stage (6,000 epochs, no weight average)",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_EARLY},
        "sil": _SIL,
    },
    "sil-20demos-e6000-prior25": {
        "about": "sil-20demos-e6000 with a quarter of each minibatch from the demos (its placebo then "
        "imitates more of its own episodes, chosen without the reward)",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_EARLY},
        "sil": {**_SIL, "prior_ratio": 0.25},
    },
    "sil-20demos-e6000-prior25-async": {
        "about": "sil-20demos-e6000-prior25 on the async actor-learner with up to 256 updates per iteration "
        "(4x the sync loop's; compare runs alone on the machine: the learner takes a core of its own)",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_EARLY, "loop": "async"},
        "sil": {**_SIL, "prior_ratio": 0.25, "updates_per_iteration": 256},
    },
    "sil-curriculum-async": {
        "about": "sil-20demos-e6000-prior25-async starting more episodes on the tasks it fails "
        "(task_curriculum: a task drawn in proportion to max(1 - its recent success rate, 0.1))",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_EARLY, "loop": "async"},
        "sil": {**_SIL, "prior_ratio": 0.25, "updates_per_iteration": 256, "task_curriculum": True},
    },
    "sil-failure-restarts-async": {
        "about": "sil-20demos-e6000-prior25-async restarting half of its finished envs in states that its "
        "recent failed episodes passed through (failure_restarts 0.5: practice where it goes wrong)",
        "algo": "sil",
        "run": {
            **_SIL_RUN,
            "init_policy": FEW_DEMO_EARLY,
            "loop": "async",
            "env_kwargs": {"restart_frames_in_info": True},
        },
        "sil": {**_SIL, "prior_ratio": 0.25, "updates_per_iteration": 256, "failure_restarts": 0.5},
    },
    "sil-failed-starts-async": {
        "about": "sil-failure-restarts-async restarting one chunk into the recent failed episodes "
        "(restart_depth 0): half of the finished envs replay starts it recently failed from",
        "algo": "sil",
        "run": {
            **_SIL_RUN,
            "init_policy": FEW_DEMO_EARLY,
            "loop": "async",
            "env_kwargs": {"restart_frames_in_info": True},
        },
        "sil": {
            **_SIL,
            "prior_ratio": 0.25,
            "updates_per_iteration": 256,
            "failure_restarts": 0.5,
            "restart_depth": 0.0,
        },
    },
    "sil-20demos-e6000-prior0": {
        "about": "sil-20demos-e6000 imitating its own successes alone once it has one (the demos until then)",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": FEW_DEMO_EARLY},
        "sil": {**_SIL, "prior_ratio": 0.0},
    },
    "clone-20demos-e6000-30min": {
        "about": "imitation alone from that first stage: BC, weight average 0.999, the same 20 demos, 30 min",
        "algo": "bc",
        "run": {**_CLONE_RUN, "init_policy": FEW_DEMO_EARLY},
        "bc": _FEW_DEMO_BC,
    },
    # -- the same pair where imitation has less to go on: one demo per task, a start cloned from it alone
    "sil-10demos-e6000-prior25-async": {
        "about": "sil-20demos-e6000-prior25-async from the 10-demo clone (6,000 epochs) with those 10 demos "
        "as its prior data",
        "algo": "sil",
        "run": {**_SIL_RUN, "init_policy": ONE_DEMO_EARLY, "loop": "async"},
        "sil": {**_SIL, "prior_data": ONE_DEMO, "prior_ratio": 0.25, "updates_per_iteration": 256},
    },
    "clone-10demos-e6000-30min": {
        "about": "imitation alone from the 10-demo clone: BC, weight average 0.999, its 10 demos, 30 min",
        "algo": "bc",
        "run": {**_CLONE_RUN, "init_policy": ONE_DEMO_EARLY},
        "bc": {**_FEW_DEMO_BC, "demos": ONE_DEMO},
    },
    # -- the self-imitation recipe as it ships (configs/libero_spatial_sil.json), the longer clone for its
    # wall time, and the recipe from that clone: the main-job study (--recipe configs/libero_spatial_sil.json)
    "sil-recipe": {
        "about": "configs/libero_spatial_sil.json as it is (the async loop: run it alone on the machine)",
        "algo": "sil",
        "run": {k: v for k, v in SIL_RECIPE["run"].items() if k in _RECIPE_RUN},
        "sil": SIL_RECIPE["sil"],
    },
    "sil-recipe-sync": {
        "about": "the recipe on the sync loop with 64 updates per iteration (the main job until the tenth "
        "session; the held-out study's sync rows)",
        "algo": "sil",
        "run": {**{k: v for k, v in SIL_RECIPE["run"].items() if k in _RECIPE_RUN}, "loop": "sync"},
        "sil": {**SIL_RECIPE["sil"], "updates_per_iteration": 64},
    },
    "clone-sil-recipe": {
        "about": "imitation alone: the SIL recipe's start trained further by BC (weight average 0.999) on "
        "its prior data for its wall time",
        "algo": "bc",
        "run": {k: SIL_RECIPE["run"][k] for k in ("policy", "init_policy", "max_minutes", "torch_threads")},
        "bc": {**_FEW_DEMO_BC, "demos": SIL_RECIPE["sil"]["prior_data"]},
    },
    "sil-recipe-warmup": {
        "about": "sil-recipe whose first 11,000 updates imitate its demos alone (warmup_updates: about 6 "
        "of its 24 minutes on one core), so self-imitation starts from a longer clone in the same budget",
        "algo": "sil",
        "run": {k: v for k, v in SIL_RECIPE["run"].items() if k in _RECIPE_RUN},
        "sil": {**SIL_RECIPE["sil"], "warmup_updates": 11_000},
    },
    "sil-recipe-from-clone": {
        "about": "sil-recipe started from clone-sil-recipe of the same seed",
        "algo": "sil",
        "start_from": "clone-sil-recipe",
        "run": {k: v for k, v in SIL_RECIPE["run"].items() if k in _RECIPE_RUN and k != "init_policy"},
        "sil": SIL_RECIPE["sil"],
    },
    "sil-only": {
        "about": "self-imitation alone (pg_coef 0), lr 1e-4, target_kl 2.0 per chunk-step, 50k steps",
        "run": {"total_steps": 50_000},
        "grpo": {"learning_rate": 1e-4, "target_kl": 2.0, "pg_coef": 0.0},
    },
}


def placebo_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The variant's control: the same settings with ``placebo`` on (scores or rewards shuffled)."""
    algo = spec.get("algo", "grpo")
    return {
        **copy.deepcopy(spec),
        "about": f"placebo of: {spec.get('about', '')}",
        algo: {**spec.get(algo, {}), "placebo": True},
    }


def recipe_variant(recipe: dict[str, Any], spec: dict[str, Any]) -> tuple[str, dict, dict]:
    """The variant's algorithm, run settings and algorithm settings (recipe + changes)."""
    algo = spec.get("algo", "grpo")
    run = {**copy.deepcopy(recipe["run"]), **spec.get("run", {})}
    own_policy = "policy" in spec.get("run", {})
    run["policy_kwargs"] = {  # a variant that names its policy takes none of the recipe's policy options
        **({} if own_policy else recipe["run"].get("policy_kwargs", {})),
        **spec.get("run", {}).get("policy_kwargs", {}),
    }
    # a variant's env_kwargs add to the recipe's (its training starts stay the study's)
    run["env_kwargs"] = {**recipe["run"].get("env_kwargs", {}), **spec.get("run", {}).get("env_kwargs", {})}
    if algo == "bc" and "loop" not in spec.get("run", {}):
        run["loop"] = "sync"  # imitation has no actor to run beside the learner: an async recipe's clone
    return algo, run, {**recipe.get(algo, {}), **spec.get(algo, {})}


def train_variant(
    algo: str,
    run: dict[str, Any],
    algo_settings: dict[str, Any],
    run_dir: Path,
    held_out: tuple[dict[str, Any], int, int] | None = None,
    sampled: tuple[dict[str, Any], int, int] | None = None,
) -> float:
    """Train one variant into ``run_dir``; returns the wall-clock seconds (evaluations included).

    ``held_out = (env kwargs, pairs, every)``: the run itself evaluates every held-out pair every
    ``every`` iterations and at the end (a held-out learning curve, in ``eval_episodes.jsonl``);
    otherwise it does not evaluate them. ``sampled = (training env kwargs, every, envs)``: the run
    also plays every start of the training env made with those kwargs (the fixed training starts)
    once, with sampled actions, before training, every ``every`` iterations and at the end, on
    ``envs`` envs (``sampled_episodes.jsonl``)."""
    from trainers.callbacks import Evaluation
    from trainers.grpo.algorithm import GRPOConfig
    from trainers.grpo.train import train as train_grpo
    from trainers.ppo.algorithm import PPOConfig
    from trainers.ppo.train import train as train_ppo
    from trainers.run import RunConfig
    from trainers.sac.algorithm import SACConfig
    from trainers.sac.train import train as train_sac
    from trainers.sil.algorithm import SILConfig
    from trainers.sil.train import train as train_sil

    evaluation: dict[str, Any] = {"eval_every": -1}  # evaluated by the caller, on every held-out pair
    if held_out is not None:
        kwargs, pairs, every = held_out
        evaluation = {"eval_every": every, "eval_env_kwargs": kwargs, "eval_episodes": pairs}
    config = RunConfig(
        **{
            **run,
            **evaluation,
            "run_dir": str(run_dir),
            "eval_at_start": False,
            "video": False,
            "checkpoint_every": 0,
            "resume": None,
            "overwrite": True,  # a variant is trained again from scratch (its folder's old run removed)
        }
    )
    callbacks = []
    if sampled is not None:
        kwargs, every, envs = sampled
        callbacks.append(
            Evaluation(
                SAMPLED,
                every=every,
                at_start=True,
                episodes="all",
                num_envs=envs,
                video=False,
                train_env_kwargs=kwargs,
                deterministic=False,
            )
        )
    t0 = time.perf_counter()
    if algo == "grpo":
        train_grpo(config, GRPOConfig(**algo_settings), callbacks)
    elif algo == "ppo":
        train_ppo(config, PPOConfig(**algo_settings), callbacks)
    elif algo == "sac":
        train_sac(config, SACConfig(**algo_settings), callbacks)
    elif algo == "sil":
        train_sil(config, SILConfig(**algo_settings), callbacks)
    elif algo == "bc":  # trainers.bc has a command line only: the settings as a --config file
        import dataclasses
        import tempfile

        from trainers.bc import main as train_bc

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps({"run": dataclasses.asdict(config), "bc": algo_settings}))
            train_bc(["--config", str(path)])
    else:
        raise BadInput(f"unknown algorithm {algo!r}: expected 'grpo', 'ppo', 'sac', 'sil' or 'bc'")
    return time.perf_counter() - t0


def ran_with(run_dir: Path, algo: str, run: dict[str, Any], algo_settings: dict[str, Any]) -> bool:
    """Whether the run in ``run_dir`` used these settings (its ``config.json``; evaluation and
    checkpoint settings, which the study sets itself, are not compared, nor a BC run's
    ``total_steps``, which ``trainers.bc`` writes as the samples its epochs take)."""
    config = _set(json.loads((run_dir / "config.json").read_text()))
    if algo not in config:
        return False
    skip = {"run_dir", "video", "checkpoint_every", "resume"} | ({"total_steps"} if algo == "bc" else set())
    return all(config[algo].get(k) == v for k, v in _set(algo_settings).items()) and all(
        config["run"].get(k) == v for k, v in _set(run).items() if k not in skip and not k.startswith("eval")
    )


def _set(value: Any) -> Any:
    """``value`` with the None entries of its dicts left out (None means "the default")."""
    if isinstance(value, dict):
        return {k: _set(v) for k, v in value.items() if v is not None}
    return [_set(v) for v in value] if isinstance(value, (list, tuple)) else value


def evaluate_held_out(source: str | Path, env_id: str, env_kwargs: dict, num_envs: int) -> list[dict]:
    """One deterministic episode per initial frame of the held-out env (rendering off)."""
    import gymnasium as gym

    from trainers.checkpoint import load_policy
    from trainers.evaluation import evaluate_episodes

    kwargs = {**env_kwargs, "cameras": []}
    env = gym.make_vec(env_id, num_envs=num_envs, autoreset_mode="Disabled", **kwargs)
    try:
        policy = load_policy(source, env.single_observation_space, env.single_action_space).eval()
        ids = list(range(len(env.unwrapped.initial_frames)))
        episodes = evaluate_episodes(policy, env, len(ids), frame_ids=ids, progress=True)
    finally:
        env.close()
    return [{"frame": ep["frame"], "task": ep["task"], "success": bool(ep["success"])} for ep in episodes]


def held_out_before(out: Path, start: str, env_id: str, env_kwargs: dict, num_envs: int, fresh: bool) -> dict:
    """The starting policy's held-out episodes: evaluated once, then read from ``before-<name>.json``."""
    path = out / f"before-{Path(start).stem}.json"
    before = json.loads(path.read_text()) if path.exists() and not fresh else None
    if before is None or before["held_out"] != env_kwargs.get("init_states") or before["policy"] != start:
        print(f"evaluating the starting policy {start} on the held-out pairs")
        episodes = evaluate_held_out(start, env_id, env_kwargs, num_envs)
        before = {"policy": start, "held_out": env_kwargs.get("init_states"), "episodes": episodes}
        write_json(path, before)
    return before


def held_out_curve(run_dir: Path, name: str = "eval") -> dict[int, list[dict]]:
    """The run's own evaluations (``name``: the held-out ones; ``SAMPLED``: the fixed training
    starts with sampled actions): env step -> episodes (frame, task, success)."""
    by_step: dict[int, list[dict]] = {}
    for line in (run_dir / f"{name}_episodes.jsonl").read_text().splitlines():
        ep = json.loads(line)
        by_step.setdefault(int(ep["env_step"]), []).append(
            {"frame": ep["frame"], "task": ep["task"], "success": bool(ep["success"])}
        )
    return by_step


def success_curve(evals: dict[int, list[dict]]) -> dict[str, list]:
    """Env steps and success rates of a run's evaluations (``held_out_curve``), in step order."""
    steps = sorted(evals)
    return {
        "env_steps": steps,
        "success": [sum(ep["success"] for ep in evals[s]) / len(evals[s]) for s in steps],
    }


def sampled_success(run_dir: Path) -> tuple[list[float], list[float]]:
    """(env steps, sampled success of the iteration's training episodes) from the run's metrics."""
    steps, success = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "env/success_once" in row:
            steps.append(float(row["step"]))
            success.append(float(row["env/success_once"]))
    return steps, success


def fixed_starts_cell(r: dict[str, Any]) -> str:
    """A result's sampled success on the fixed training starts, before -> after training ("n/a":
    a result from before the study measured it)."""
    curve = r.get("sampled_curve") or {}
    if not curve.get("success"):
        return "n/a"
    return f"{curve['success'][0]:.2f} -> {curve['success'][-1]:.2f}"


def rate(episodes: list[dict]) -> dict[str, Any]:
    k, n = sum(ep["success"] for ep in episodes), len(episodes)
    return {"successes": k, "trials": n, "rate": k / max(n, 1), "ci95": list(wilson_interval(k, n))}


def paired(before: list[dict], after: list[dict]) -> dict[str, Any]:
    """Gained / lost pairs and the McNemar p-value (pairs matched by frame id)."""
    outcome = {ep["frame"]: ep["success"] for ep in before}
    gained = sum(ep["success"] and not outcome[ep["frame"]] for ep in after)
    lost = sum(outcome[ep["frame"]] and not ep["success"] for ep in after)
    return {"gained": gained, "lost": lost, "p": mcnemar_p(gained, lost)}


def pooled_comparisons(results: list[dict], wanted: list[list[str]] | None) -> list[dict[str, Any]]:
    """Variant A against variant B pooled over the seeds both ran: every (seed, held-out pair) with
    both outcomes, A's successes against B's and the exact McNemar test on the pairs that differ, and
    A's success rate minus B's on each seed with a t-test over the seeds (``over_seeds_p``).
    ``wanted``: the (A, B) pairs; by default each variant against its placebo and against the
    imitation controls (``clone-*``) that ran."""
    by_name: dict[str, dict[int, list[dict]]] = {}
    for r in results:
        by_name.setdefault(r["variant"], {})[r["seed"]] = r["after"]
    if wanted is None:
        clones = [n for n in by_name if n.startswith("clone-")]
        wanted = [[n, f"{n}-placebo"] for n in by_name if f"{n}-placebo" in by_name]
        wanted += [[n, c] for n in by_name for c in clones if n not in clones and not n.endswith("-placebo")]
    out = []
    for a, b in wanted:
        seeds = sorted(set(by_name.get(a, {})) & set(by_name.get(b, {})))
        if not seeds:
            continue
        a_eps = [{**ep, "frame": (s, ep["frame"])} for s in seeds for ep in by_name[a][s]]
        b_eps = [{**ep, "frame": (s, ep["frame"])} for s in seeds for ep in by_name[b][s]]
        pairs = paired(b_eps, a_eps)  # "gained": A succeeded where B failed
        diffs = [rate(by_name[a][s])["rate"] - rate(by_name[b][s])["rate"] for s in seeds]
        out.append({
            "a": a, "b": b, "seeds": seeds, "a_rate": rate(a_eps), "b_rate": rate(b_eps), **pairs,
            "seed_differences": diffs, "seeds_p": over_seeds_p(diffs),
        })  # fmt: skip
    return out


def over_seeds_p(differences: list[float]) -> float | None:
    """Two-sided p of a paired t-test over seeds (A's success rate minus B's on each), or None with
    fewer than two seeds or no spread. The run is the unit here: McNemar's p over pooled pairs takes
    the evaluation episodes as the only randomness, but two training runs of one recipe differ too
    (on the selection split one process landed at 62 and 47/100, McNemar p = 0.011:
    benchmarks/README.md), so between recipes it overstates the evidence."""
    if len(differences) < 2 or len(set(differences)) < 2:
        return None
    from scipy.stats import ttest_1samp

    return float(ttest_1samp(differences, 0.0).pvalue)


def cell(r: dict[str, Any]) -> str:
    return f"{r['successes']}/{r['trials']} {r['rate']:.0%} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog=program_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="configs/libero_spatial_grpo.json")
    parser.add_argument("--variants", nargs="*", default=None, help=f"default: all of {list(VARIANTS)}")
    parser.add_argument("--define", type=json.loads, default={}, help="extra variants: JSON {name: spec}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=None, help="env steps per run (default: the recipe's)")
    parser.add_argument("--eval-init-states", type=int, nargs="+", default=None, help="default: the recipe's")
    parser.add_argument(
        "--train-init-states",
        type=int,
        nargs="+",
        default=None,
        help="the training starts of every variant (default: the recipe's); with --eval-init-states, "
        "a selection split: e.g. train on 0-29, choose on 30-39, never touching the held-out 40-49",
    )
    parser.add_argument("--eval-envs", type=int, default=4)
    parser.add_argument(
        "--curve-every", type=int, default=0, help="also evaluate the held-out pairs every N iterations"
    )
    parser.add_argument(
        "--sampled-init-states",
        type=int,
        nargs="+",
        default=[0, 1],
        help="training init states whose (task, init state) pairs, every task, are the fixed training "
        "starts played with sampled actions (default: 0 1)",
    )
    parser.add_argument(
        "--sampled-every",
        type=int,
        default=5,
        help="play the fixed training starts every N iterations, and before and after training "
        "(0: before and after only; -1: never)",
    )
    parser.add_argument(
        "--placebo", action="store_true", help="also run each variant with its scores shuffled (a control)"
    )
    parser.add_argument(
        "--compare",
        nargs=2,
        action="append",
        metavar=("A", "B"),
        default=None,
        help="variant A against B pooled over seeds (repeatable; default: each against its placebo and "
        "against the clone-* controls)",
    )
    parser.add_argument("--fresh", action="store_true", help="retrain runs that have a result")
    parser.add_argument(
        "--report", action="store_true", help="train nothing: the table of every finished run under --out"
    )
    parser.add_argument("--out", default="runs/benchmarks/rl_recipe_study")
    args = parser.parse_args(argv)
    import envs  # noqa: F401  (registers the ids)
    from trainers.checkpoint import latest_checkpoint

    recipe = json.loads(Path(args.recipe).read_text())
    variants = {**VARIANTS, **args.define}
    names = args.variants or list(variants)
    unknown = [n for n in names if n not in variants]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(variants)}")
    for name in list(names):  # a variant started from another's policy runs after it
        start_from = variants[name].get("start_from")
        if start_from and start_from not in names[: names.index(name)]:
            names.insert(names.index(name), start_from)
    if args.placebo:  # each RL variant's shuffled-score control right after it
        for name in list(names):
            rl = variants[name].get("algo", "grpo") != "bc"
            if rl and not name.endswith("-placebo") and f"{name}-placebo" not in names:
                variants[f"{name}-placebo"] = placebo_of(variants[name])
                names.insert(names.index(name) + 1, f"{name}-placebo")
    if args.train_init_states:
        recipe["run"]["env_kwargs"] = {**recipe["run"]["env_kwargs"], "init_states": args.train_init_states}
    base_run = recipe["run"]
    eval_kwargs = dict(base_run.get("eval_env_kwargs") or base_run["env_kwargs"])
    if args.eval_init_states:
        eval_kwargs["init_states"] = args.eval_init_states
    train_states = set(base_run["env_kwargs"].get("init_states", []))
    if not train_states or set(eval_kwargs.get("init_states", [])) & train_states:
        parser.error("the held-out init states must be set and disjoint from the training ones")
    fixed_states = sorted(set(args.sampled_init_states))
    if not set(fixed_states) <= train_states:
        parser.error(f"--sampled-init-states {fixed_states} must be training init states")
    env_id = base_run["env"].split(":")[-1]
    out = Path(args.out)

    befores: dict[str, dict] = {}  # starting policy -> its held-out episodes

    def before_of(start: str) -> dict:
        if start not in befores:
            befores[start] = held_out_before(out, start, env_id, eval_kwargs, args.eval_envs, args.fresh)
        return befores[start]

    results = []
    if args.report:
        found = sorted(out.glob("*/result.json"))
        results = [json.loads(f.read_text()) for f in found]
        results.sort(
            key=lambda r: (list(variants).index(r["variant"]) if r["variant"] in variants else 99, r["seed"])
        )
        names = []
    for name in names:
        for seed in args.seeds:
            run_dir = out / f"{name}-s{seed}"
            result_file = run_dir / "result.json"
            algo, run, algo_settings = recipe_variant(recipe, variants[name])
            run.update(seed=seed, total_steps=args.steps or run["total_steps"])
            if variants[name].get("start_from"):  # that variant's policy of the same seed
                run["init_policy"] = str(out / f"{variants[name]['start_from']}-s{seed}")
            if result_file.exists() and not args.fresh:
                found = json.loads(result_file.read_text())
                same_starts = (found.get("sampled_curve") or {}).get("init_states") == fixed_states
                same_starts |= algo == "bc"  # imitation plays no training starts
                if ran_with(run_dir, algo, run, algo_settings) and (same_starts or args.sampled_every < 0):
                    results.append(found)
                    continue
                why = "other settings" if same_starts else "no sampled curve on these fixed starts"
                print(f"{run_dir} was trained with {why}: training it again")
            print(f"variant {name}, seed {seed}: {algo} for {run['total_steps']} env steps")
            result_file.unlink(missing_ok=True)  # the old run's result goes with it (--overwrite)
            before = before_of(run["init_policy"])
            sampled = None
            if args.sampled_every >= 0 and algo != "bc":  # the training env's tasks x the fixed init states
                fixed_kwargs = {**run["env_kwargs"], "init_states": fixed_states}
                sampled = (fixed_kwargs, args.sampled_every, args.eval_envs)
            curve: dict[str, list] = {"env_steps": [], "success": []}
            if args.curve_every > 0:
                run["eval_num_envs"] = args.eval_envs
                pairs = len(before["episodes"])
                held_out = ({**eval_kwargs, "cameras": []}, pairs, args.curve_every)
                wall = train_variant(algo, run, algo_settings, run_dir, held_out, sampled)
                evals = held_out_curve(run_dir)
                curve = success_curve(evals)
                after = evals[max(evals)]
            else:
                wall = train_variant(algo, run, algo_settings, run_dir, sampled=sampled)
                after = evaluate_held_out(run_dir, env_id, eval_kwargs, args.eval_envs)
            sampled_curve = None
            if sampled is not None:
                evals = held_out_curve(run_dir, SAMPLED)
                sampled_curve = {
                    **success_curve(evals),
                    "init_states": fixed_states,
                    "pairs": len(evals[min(evals)]),
                    "every": args.sampled_every,
                }
            _, data = latest_checkpoint(run_dir)
            steps, success = sampled_success(run_dir)
            result = {
                "variant": name,
                "seed": seed,
                "about": variants[name].get("about", ""),
                "algo": algo,
                "start": run["init_policy"],
                "changes": {k: v for k, v in variants[name].items() if k != "about"},
                "env_steps": data["counters"]["env_steps"],
                "train_wall_s": wall,
                "curve": {"env_steps": steps, "sampled_success": success},  # training episodes
                "sampled_curve": sampled_curve,  # the fixed training starts, sampled actions
                "held_out_curve": curve,
                "after": after,
            }
            write_json(result_file, result)
            results.append(result)

    header = ["variant", "seed", "start", "env steps", "train min",
              "sampled success, fixed train starts: before->after", "held-out before", "held-out after",
              "change", "+/- pairs", "McNemar p"]  # fmt: skip
    rows, series = [], {}
    for r in results:
        start = r.setdefault("start", base_run["init_policy"])  # results written before "start" was kept
        before = before_of(start)
        before_rate, after_rate = rate(before["episodes"]), rate(r["after"])
        pairs = paired(before["episodes"], r["after"])
        r.update(before=before_rate, after_rate=after_rate, pairs=pairs)
        rows.append(
            [
                r["variant"], r["seed"], Path(start).stem, r["env_steps"], r["train_wall_s"] / 60,
                fixed_starts_cell(r), cell(before_rate), cell(after_rate),
                f"{after_rate['rate'] - before_rate['rate']:+.0%}", f"+{pairs['gained']} -{pairs['lost']}",
                pairs["p"],
            ]
        )  # fmt: skip
        fixed = r.get("sampled_curve") or {}
        if fixed.get("success"):
            series[f"{r['variant']} s{r['seed']}"] = (fixed["env_steps"], fixed["success"])
    sets = sorted({(tuple(c["init_states"]), c["pairs"]) for r in results if (c := r.get("sampled_curve"))})
    fixed_about = "; ".join(f"init states {list(states)} of every task ({n} pairs)" for states, n in sets)
    title = (
        f"RL on {env_id} (training init states {min(train_states)}-{max(train_states)}); "
        f"held-out init states {eval_kwargs['init_states']}: one deterministic episode per (task, state); "
        f"sampled: one episode with sampled actions per fixed training start, {fixed_about or 'none'}, "
        "before and after training"
    )
    text = table(header, rows, title)
    print(text)
    curves = {
        f"{r['variant']} s{r['seed']}": (
            [0, *r["held_out_curve"]["env_steps"]],
            [r["before"]["rate"], *r["held_out_curve"]["success"]],
        )
        for r in results
        if r.get("held_out_curve", {}).get("env_steps")
    }
    if curves:
        plot_lines(
            out / "held_out_curves.png",
            curves,
            xlabel="env steps",
            ylabel="held-out success (deterministic)",
            title="RL recipe study: held-out evaluations during training",
        )
        for name, (x, y) in curves.items():
            print(f"held-out curve {name}: " + ", ".join(f"{a}: {b:.2f}" for a, b in zip(x, y, strict=True)))
    if series:
        plot_lines(
            out / "learning_curves.png",
            series,
            xlabel="env steps",
            ylabel="success, sampled actions",
            title=f"RL recipe study: the fixed training starts\n{fixed_about}",
        )
    comparisons = pooled_comparisons(results, args.compare)
    if comparisons:
        print(
            table(
                [
                    "A",
                    "B",
                    "seeds",
                    "A success",
                    "B success",
                    "A - B",
                    "+/- pairs (A won / lost)",
                    "McNemar p",
                    "A - B per seed",
                    "t over seeds p",
                ],
                [
                    [
                        c["a"],
                        c["b"],
                        " ".join(map(str, c["seeds"])),
                        cell(c["a_rate"]),
                        cell(c["b_rate"]),
                        f"{c['a_rate']['rate'] - c['b_rate']['rate']:+.1%}",
                        f"+{c['gained']} -{c['lost']}",
                        c["p"],
                        " ".join(f"{d:+.0%}" for d in c["seed_differences"]),
                        "n/a" if c["seeds_p"] is None else f"{c['seeds_p']:.3g}",
                    ]
                    for c in comparisons
                ],  # fmt: skip
                "pooled over seeds: the same (seed, task, init state) pairs, A's outcome against B's "
                "(exact McNemar: the episodes as the only randomness, so between two recipes' runs it "
                "overstates); t over seeds: a paired t-test on the per-seed differences, runs as the unit "
                "(needs 2+ seeds; weak with few)",
            )
        )
    summary = {
        "table": text,
        "comparisons": comparisons,
        "before": {start: rate(b["episodes"]) for start, b in befores.items()},
        "results": results,
        "args": vars(args),
    }
    write_json(out / "rl_recipe_study.json", summary)
    return summary


if __name__ == "__main__":
    run_cli(main)
