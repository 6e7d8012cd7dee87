"""GRPO: group-relative advantages, dynamic sampling, asymmetric clipping, batches of whole episodes, the
config, and a short run that learns."""
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from roborl.algos.advantages import group_advantages, group_advantages_to_go, informative_groups
from roborl.algos.grpo import GRPO, Episodes, build_batch_for
from roborl.algos.ppo import clip_active, clipped_surrogate
from roborl.config import GRPOConfig, PPOConfig, load_config
from roborl.errors import UserError
from roborl.runner import Runner

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 3.0])


def test_group_advantages_by_hand():
    s = 3 ** -0.5  # std of [1, 0, 0, 1] with Bessel's correction: sqrt(4 · 0.25 / 3)
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0, -0.5, -0.5, -0.5, 1.5]  # last group: std 1.5
    assert torch.allclose(group_advantages(REWARDS, 4, eps=0.0).nan_to_num(0.0), torch.tensor(expected), atol=1e-6)
    assert torch.allclose(group_advantages(REWARDS, 4), torch.tensor(expected), atol=1e-4)  # eps keeps 0/0 at 0
    dr = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -0.75, -0.75, -0.75, 2.25]  # Dr.GRPO: no std
    assert torch.allclose(group_advantages(REWARDS, 4, std_normalize=False), torch.tensor(dr))


def test_return_to_go_advantages_by_hand():
    # two groups of 2 envs, 3 steps; env 1 ends after step 1 (zero reward after), env 2 and 3 differ only at t=0
    rewards = torch.tensor([[1.0, 0.0, 5.0, 4.0],
                            [0.0, 2.0, 1.0, 1.0],
                            [3.0, 0.0, 1.0, 1.0]])
    to_go = torch.tensor([[4.0, 2.0, 7.0, 6.0], [3.0, 2.0, 2.0, 2.0], [3.0, 0.0, 1.0, 1.0]])
    centred = torch.tensor([[1.0, -1.0, 0.5, -0.5], [0.5, -0.5, 0.0, 0.0], [1.5, -1.5, 0.0, 0.0]])
    assert torch.allclose(group_advantages_to_go(rewards, 2, std_normalize=False), centred)
    episode_std = torch.tensor([2 ** 0.5, 2 ** 0.5, 0.5 ** 0.5, 0.5 ** 0.5])  # std of [4, 2] and of [7, 6]
    assert torch.allclose(group_advantages_to_go(rewards, 2, eps=0.0), centred / episode_std)
    # at t = 0 the return to go is the episode return: the first row is GRPO's episode advantage
    assert torch.allclose(group_advantages_to_go(rewards, 2)[0], group_advantages(to_go[0], 2), atol=1e-5)


def test_zero_variance_groups_are_found():
    assert informative_groups(REWARDS, 4).tolist() == [True, False, True]
    assert informative_groups(torch.tensor([1.0, 1.0, 0.0, 0.0]), 2).tolist() == [False, False]


def test_asymmetric_clip_region_by_hand():
    ratio = torch.tensor([0.7, 0.79, 0.81, 1.0, 1.27, 1.29, 1.5], requires_grad=True)
    pos, neg = torch.ones(7), -torch.ones(7)
    lo, hi = 0.2, 0.28
    by_hand_pos = -torch.tensor([0.7, 0.79, 0.81, 1.0, 1.27, 1.28, 1.28])  # −min(r, 1.28): capped above only
    by_hand_neg = torch.tensor([0.8, 0.8, 0.81, 1.0, 1.27, 1.29, 1.5])  # max(r, 0.8): floored below only
    assert torch.allclose(clipped_surrogate(ratio, pos, lo, hi), by_hand_pos)
    assert torch.allclose(clipped_surrogate(ratio, neg, lo, hi), by_hand_neg)
    assert clip_active(ratio, pos, lo, hi).tolist() == [False] * 5 + [True, True]  # only above 1 + clip_high
    assert clip_active(ratio, neg, lo, hi).tolist() == [True, True] + [False] * 5  # only below 1 − clip_low
    for adv in (pos, neg):
        (grad,) = torch.autograd.grad(clipped_surrogate(ratio, adv, lo, hi).sum(), ratio)
        assert ((grad == 0) == clip_active(ratio, adv, lo, hi)).all()  # clipped rows get no gradient


def fake_round(rewards: list[float], lengths: list[int], T: int = 4) -> tuple[Episodes, torch.Tensor]:
    """A round of len(rewards) envs whose first episodes last `lengths` steps; the action of env i at step t
    is 10·t + i, so rows can be traced."""
    n = len(rewards)
    steps = [{"obs": {"state": torch.full((n, 1), float(t))}, "actions": (10 * t + torch.arange(n)).float()[:, None],
              "log_probs": torch.zeros(n), "extras": {}} for t in range(T)]
    valid = torch.arange(T)[:, None] < torch.tensor(lengths)[None]
    return Episodes(steps, valid, [], {}, torch.zeros(T, n)), torch.tensor(rewards)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_batch_keeps_the_steps_of_informative_groups(loss_agg):
    cfg = GRPOConfig(group_size=2, loss_agg=loss_agg)
    eps, reward = fake_round([1.0, 0.0, 1.0, 1.0], [2, 4, 3, 1])
    keep = informative_groups(reward, 2)
    batch = build_batch_for(cfg, [(eps, reward, keep)], torch.device("cpu"), [])
    data = batch.flat()
    # env 0 (2 steps) and env 1 (4 steps) only; group 2 (rewards 1, 1) is dropped
    assert sorted(data["actions"][:, 0].tolist()) == [0, 1, 10, 11, 21, 31]
    adv = {int(a) % 10: float(v) for a, v in zip(data["actions"][:, 0], data["advantages"])}
    assert adv[0] == pytest.approx(0.5 / 0.5 ** 0.5, rel=1e-4) and adv[1] == pytest.approx(-(0.5 ** 0.5), rel=1e-4)
    weights = {int(a) % 10: float(w) for a, w in zip(data["actions"][:, 0], data["weights"])}
    assert weights == ({0: 1.0, 1: 1.0} if loss_agg == "token_mean" else {0: 0.5, 1: 0.25})


def test_return_to_go_batch_gives_each_step_its_own_advantage():
    eps, _ = fake_round([0.0] * 4, [2, 4, 3, 1])
    eps.rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0],
                                [0.0, 1.0, 0.0, 0.0]]) * eps.valid  # returns 2, 4 | 1, 1
    reward = eps.rewards.sum(0)
    keep = informative_groups(reward, 2)
    batch = build_batch_for(GRPOConfig(group_size=2, reward="return_to_go", std_normalize=False),
                            [(eps, reward, keep)], torch.device("cpu"), [])
    adv = {int(a): float(v) for a, v in zip(batch.flat()["actions"][:, 0], batch.flat()["advantages"])}
    # returns to go: env 0 [2, 1, 0, 0], env 1 [4, 4, 4, 1]; each step against the group's mean at that step
    assert adv == {0: -1.0, 1: 1.0, 10: -1.5, 11: 1.5, 21: 2.0, 31: 0.5}


def test_grpo_loss_weights_and_instructions():
    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen = []

        def evaluate(self, obs, act):
            self.seen.append(obs["instruction"])
            return self.w.expand(len(act.action)), torch.zeros(len(act.action)), None

    policy = Policy()
    algo = GRPO(policy, PPOConfig(), GRPOConfig(loss_agg="seq_mean_token_mean"))
    algo.vocab = ["push the red cube", "lift the blue block"]
    mb = {"obs": {"instruction_ids": torch.tensor([1, 0, 0])}, "actions": torch.zeros(3, 1),
          "log_probs": torch.zeros(3), "extras": {}, "advantages": torch.tensor([1.0, -1.0, 2.0]),
          "weights": torch.tensor([1.0, 0.5, 0.5])}
    loss, terms = algo.minibatch_loss(mb)
    assert policy.seen == [["lift the blue block", "push the red cube", "push the red cube"]]
    assert terms["policy_loss"].item() == pytest.approx(-(1.0 - 0.5 + 1.0) / 2.0)  # weighted mean of −A at ratio 1


def grpo_cfg(tmp_path, *overrides: str):
    return load_config(None, [
        "env.id=mujoco/LangTabletop-Reach", "env.obs_mode=state", "env.num_envs=32", "env.episode_length=20",
        "train.rollout_steps=20", "train.algorithm=grpo", "grpo.group_size=8", "policy.hidden=[64,64]",
        "algo.lr=0.003", "algo.epochs=2", "algo.minibatches=4", "train.eval_every=1000", "train.eval_episodes=8",
        "train.eval_envs=8", "train.video=false", "train.progress=false", f"train.run_dir={tmp_path}", *overrides])


def test_config_and_trainer_choice(tmp_path):
    assert load_config(None, []).train.algorithm == "ppo"  # PPO with a critic stays the default
    with pytest.raises(UserError, match="grpo.reward 'win' is unknown; available: success"):
        load_config(None, ["grpo.reward=win"])
    with pytest.raises(UserError, match=r"config key 'grpo.group_size' must be >= 2, got 1"):
        load_config(None, ["grpo.group_size=1"])
    with pytest.raises(UserError, match=r"config key 'algo.clip_high' is not read by train.algorithm grpo \(it is read by "
                                        r"ppo\)"):
        load_config(None, ["train.algorithm=grpo", "algo.clip_high=0.28"])
    with pytest.raises(UserError, match="multiple of grpo.group_size"):
        Runner(grpo_cfg(tmp_path, "train.name=a", "env.num_envs=12"))
    with pytest.raises(UserError, match=r"set train.rollout_steps to the episode length \(20\)"):
        Runner(grpo_cfg(tmp_path, "train.name=b", "train.rollout_steps=50"))
    runner = Runner(grpo_cfg(tmp_path, "train.name=c"))
    assert isinstance(runner.algo, GRPO)
    assert runner.env.unwrapped.group_size == 8
    runner.env.close()


def test_dropped_groups_are_counted(tmp_path):
    runner = Runner(grpo_cfg(tmp_path, "train.name=d", "grpo.reward=success"))
    rounds = []
    collect = runner.algo.collect_round
    runner.algo.collect_round = lambda env, index: rounds.append(collect(env, index)) or rounds[-1]
    runner.obs = runner.env.reset(seed=0)
    stats, _ = runner.iterate(1)
    reward = rounds[0].outcome["success_once"]
    flat = informative_groups(reward, 8)
    assert stats["groups"] == 4 and stats["groups_dropped"] == int((~flat).sum())
    assert stats["skipped_update"] == float(not flat.any())
    runner.env.close()


@pytest.mark.learning
def test_grpo_learns_language_reach(tmp_path):
    """Outcome reward = the episode's return; the learning curve of rollout returns rises."""
    Runner(grpo_cfg(tmp_path, "train.name=learn", "grpo.reward=return", "train.total_steps=14080")).train()
    acc = EventAccumulator(str(tmp_path / "learn" / "tb"))
    acc.Reload()
    returns = [e.value for e in acc.Scalars("rollout/return")]
    assert len(returns) == 22
    first, last = sum(returns[:5]) / 5, sum(returns[-5:]) / 5
    assert last > first + 1.0, returns
    assert {"train/groups_dropped", "train/clip_frac", "train/policy_loss"} <= set(acc.Tags()["scalars"])
