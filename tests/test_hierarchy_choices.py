"""Choice states of hierarchies of reward machines (a state with several calls): the batched call stack and the
flat machine equal the one-env reference on random traces through choices (inside a callee too); calls that
could start on the same labels are refused; the option learner acts as the chosen callee, is paid its reward
and ends where another callee starts; the SMDP learner of calls stores what a decision earned and learns to
pick the better call; and a run trains, saves and evaluates the chooser with its policy."""
import random

import pytest
import torch

from roborl.rm import CompiledRM, RMBuilder
from roborl.rm.hierarchy import FAILED, CompiledHierarchy, Hierarchy, flatten

LABELS = ["a", "b", "c", "h"]


def with_choices() -> Hierarchy:
    """root chooses between `left` (starts on a) and `right` (starts where `leaf` does, on b), then calls the
    other and needs c; `right` itself chooses between `leaf` and `left` after its first call; `leaf` fails on h."""
    leaf = (RMBuilder("l0").edge("l0", "l1", "b", 0.1).edge("l1", "l2", "c & !h", 0.2).edge("l1", "bad", "h")
            .accepting("l2").failing("bad").build())
    left = RMBuilder("a0").edge("a0", "a1", "a", 1.0).accepting("a1").build()
    right = (RMBuilder("b0").call("b0", "b1", "leaf", "!a", 0.5).call("b1", "b2", "leaf", "!a")
             .call("b1", "b2", "left", "true", 0.7).accepting("b2").build())
    root = (RMBuilder("r0").call("r0", "r1", "left", "!b").call("r0", "r2", "right", "!a")
            .call("r1", "r3", "right", "true").call("r2", "r3", "left", "true", 2.0)
            .edge("r3", "done", "c", 3.0).accepting("done").build())
    return Hierarchy({"root": root, "left": left, "right": right, "leaf": leaf}, "root")


def random_traces(n, length, seed):
    rng = random.Random(seed)
    return [[{name for name in LABELS if rng.random() < (0.08 if name == "h" else 0.35)} for _ in range(length)]
            for _ in range(n)]


def test_a_choice_waits_then_takes_the_call_whose_callee_starts():
    h = with_choices()
    assert set(h.choices) == {("root", "r0"), ("right", "b1")}
    assert h.step(h.initial, {"c"}) == (h.initial, 0.0)  # nothing starts: the choice waits, paying nothing
    config, reward = h.step(h.initial, {"a"})  # left starts and, reading a, returns at once
    assert config == (("root", "r1", 0.0),) and reward == pytest.approx(1.0)
    config, reward = h.step(h.initial, {"b"})  # right starts: it calls leaf, which reads b
    assert config == (("root", "r2", 0.0), ("right", "b1", 0.5), ("leaf", "l1", 0.0)) and reward == pytest.approx(0.1)
    assert h.step(h.initial, {"a", "b"}) == (h.initial, 0.0)  # the contexts exclude both there


def test_the_batched_call_stack_and_the_flat_machine_equal_the_reference_through_choices():
    h = with_choices()
    compiled, flat = CompiledHierarchy(h, LABELS), CompiledRM(flatten(h), LABELS)
    traces = random_traces(300, 30, seed=0)
    stack, u = compiled.reset(len(traces)), torch.full((len(traces),), flat.initial)
    configs = [h.initial] * len(traces)
    saw = {"waited": 0, "left_first": 0, "right_first": 0, "inner_choice_to_left": 0, "accept": 0, "fail": 0}
    for t in range(30):
        labels = torch.tensor([[name in trace[t] for name in LABELS] for trace in traces])
        stack, reward = compiled.step(stack, labels)
        u, flat_reward = flat.step(u, labels)
        torch.testing.assert_close(reward, flat_reward)
        got = compiled.configs(stack)
        for i, trace in enumerate(traces):
            before = configs[i]
            configs[i], want = h.step(before, set(trace[t]))
            assert got[i] == configs[i], (i, t)
            assert reward[i].item() == pytest.approx(want), (i, t)
            saw["waited"] += before == h.initial and configs[i] == h.initial
            saw["left_first"] += before == h.initial and configs[i][0][1] == "r1"
            saw["right_first"] += before == h.initial and configs[i][0][1] == "r2"
            saw["inner_choice_to_left"] += len(before) > 1 and before[1][1] == "b1" and configs[i] != FAILED and \
                len(configs[i]) > 1 and configs[i][1][1] == "b2"
        saw["accept"] += int(compiled.accepts(stack).sum())
        saw["fail"] += int(stack["failed"].sum())
        assert compiled.accepts(stack).tolist() == flat.accepting[u].tolist()
    assert all(saw.values()), saw


def test_calls_that_could_start_on_the_same_labels_are_refused():
    left = RMBuilder("a0").edge("a0", "a1", "a").accepting("a1").build()
    both = RMBuilder("b0").edge("b0", "b1", "a | b").accepting("b1").build()
    root = RMBuilder("r0").call("r0", "r1", "left").call("r0", "r2", "both").accepting("r1", "r2").build()
    h = Hierarchy({"root": root, "left": left, "both": both}, "root")
    with pytest.raises(ValueError, match="choice 'r0' of machine 'root' could call left and both on labels \\['a'\\]"):
        CompiledHierarchy(h, ["a", "b"])
    with pytest.raises(ValueError, match="calls several machines \\(a choice\\) and has plain edges"):
        Hierarchy({"root": RMBuilder("r0").call("r0", "r1", "left").call("r0", "r1", "both").edge("r0", "r2", "c")
                   .accepting("r1", "r2").build(), "left": left, "both": both}, "root")


class Always(torch.nn.Module):
    """Chooses one call everywhere (a stand-in for a trained chooser in the env test)."""

    def __init__(self, call: int) -> None:
        super().__init__()
        self.call, self.unused = call, torch.nn.Parameter(torch.zeros(1))

    def choose(self, x, mask):
        return torch.full((len(x),), self.call, dtype=torch.long)


def test_the_option_learner_acts_as_the_chosen_callee_until_a_callee_starts():
    """Errands driven by its expert (shorter tour first), the root's choice always touch_a: every env starts
    as touch_a's option and, while it waits, is paid red's approach term; where the expert touches red first
    that option returns paying 1, where it touches blue first touch_a's option ends there, paid its approach
    term, and the root has taken the call to touch_b."""
    from helpers import ROOT

    from roborl import sim, tasks
    from roborl.rm import HierarchyEnv, load_hierarchy
    from roborl.tasks.sequence import APPROACH_GAIN

    n = 16
    base = sim.make("mujoco/Errands", n, seed=0)
    env, expert = HierarchyEnv(base, load_hierarchy(str(ROOT / "tasks" / "errands.rm"))), tasks.EXPERTS["mujoco/Errands"](base)
    env.use_chooser(Always(0).eval())
    assert env.calls.names == ["root.s0 -> touch_a", "root.s0 -> touch_b"]
    obs = env.reset(seed=0)
    expert.reset()
    touch_a = env.options.index("touch_a", "0")
    assert (obs["rm_state"] == touch_a).all()
    red_first = expert.first == 0
    assert 0 < int(red_first.sum()) < n  # the expert takes both orders
    waiting = torch.ones(n, dtype=torch.bool)
    while waiting.any():
        before = base.last_dist[:, 0].clone()
        obs, reward, term, trunc, info = env.step(expert.act(obs))
        assert not (term | trunc).any()
        approach_red = (APPROACH_GAIN * (before - base.last_dist[:, 0])).float()
        ended = info["option_end"] & waiting
        wait = waiting & ~ended
        torch.testing.assert_close(reward[wait], approach_red[wait])
        assert (obs["rm_state"][wait] == touch_a).all()
        for i in ended.nonzero().flatten().tolist():
            if red_first[i]:
                assert reward[i].item() == 1.0 and env.stack["state"][i, 0].item() == 1  # root.s1: red done
            else:
                assert reward[i].item() == pytest.approx(approach_red[i].item())
                assert env.stack["state"][i, 0].item() == 2  # root.s2: blue done, red next
        waiting &= ~ended


def test_a_decision_on_errands_earns_the_discounted_pay_of_the_last_return():
    """Errands driven by its expert, each env's first episode: the decision made at its start is stored when the
    episode ends, paid γ^(T−1) (the call to touch_c pays 1 on return at step T), discounted γ^T, terminal; the
    options' own rewards (approach terms, 1 per touch) are not the decision's."""
    from helpers import ROOT

    from roborl import sim, tasks
    from roborl.policies.call_chooser import CallChooser
    from roborl.rm import HierarchyEnv, load_hierarchy
    from roborl.rm.call_learning import CallLearner

    n, gamma = 8, 0.9
    base = sim.make("mujoco/Errands", n, seed=0)
    env, expert = HierarchyEnv(base, load_hierarchy(str(ROOT / "tasks" / "errands.rm"))), tasks.EXPERTS["mujoco/Errands"](base)
    chooser = CallChooser(env.observation_space["state"].shape[0], env.calls.count, epsilon=0.0)
    learner = CallLearner(chooser, n, gamma, batch=10**6)
    env.use_chooser(chooser, learner)
    obs = env.reset(seed=0)
    expert.reset()
    first = env.chosen.clone()
    length = torch.zeros(n, dtype=torch.long)
    for t in range(1, 101):
        obs, reward, term, trunc, info = env.step(expert.act(obs))
        expert.reset(term | trunc)
        assert not trunc.any()
        length[(length == 0) & term] = t
        if (length > 0).all():
            break
    assert (length > 0).all() and learner.size >= n
    ended_first = {}  # each env's first stored decision, in the order episodes ended
    order = sorted(range(n), key=lambda i: int(length[i]))
    for row, i in zip(range(learner.size), order):
        ended_first[i] = row
    for i, row in ended_first.items():
        T = int(length[i])
        assert learner.replay["paid"][row].item() == pytest.approx(gamma ** (T - 1), rel=1e-5), (i, T)
        assert learner.replay["discount"][row].item() == pytest.approx(gamma ** T, rel=1e-5)
        assert bool(learner.replay["done"][row]) and int(learner.replay["call"][row]) == int(first[i])


def test_a_decision_earns_what_call_edges_pay_until_the_next_choice_or_the_end():
    from roborl.policies.call_chooser import CallChooser
    from roborl.rm.call_learning import CallLearner

    learner = CallLearner(CallChooser(3, 2), num_envs=3, gamma=0.5, batch=2, capacity=8)
    x = torch.arange(9.0).view(3, 3)
    mask = torch.tensor([[True, True]] * 3)
    learner.decide(torch.arange(3), x, mask, torch.tensor([0, 1, 0]))
    learner.pay(torch.tensor([1.0, 0.0, 4.0]), torch.zeros(3, dtype=torch.bool), torch.zeros(3, dtype=torch.bool))
    learner.pay(torch.tensor([2.0, 8.0, 0.0]), torch.tensor([False, True, False]), torch.tensor([False, False, True]))
    assert learner.size == 1  # env 1 ended (terminal); env 2 was truncated: its decision is dropped
    learner.decide(torch.tensor([0]), x[[2]], mask[[0]], torch.tensor([1]))  # env 0's next choice ends its first
    r = {k: v[:learner.size] for k, v in learner.replay.items()}
    assert r["paid"].tolist() == [4.0, 2.0]  # 0 + 0.5·8, and 1 + 0.5·2
    assert r["discount"].tolist() == [0.25, 0.25] and r["done"].tolist() == [True, False]
    assert r["call"].tolist() == [1, 0] and torch.equal(r["next_x"][1], x[2]) and torch.equal(r["x"][0], x[1])
    assert learner.open.tolist() == [True, False, False]


def test_the_call_learner_learns_which_call_pays_more_where():
    """A contextual choice: call 0 pays 1 where the state's first feature is positive, call 1 pays 1 elsewhere;
    both end the episode. After learning from ε-greedy decisions the greedy choice is right almost everywhere."""
    from roborl.policies.call_chooser import CallChooser
    from roborl.rm.call_learning import CallLearner

    torch.manual_seed(0)
    n = 64
    chooser = CallChooser(4, 2, epsilon=0.3)
    learner = CallLearner(chooser, n, gamma=0.9, lr=3e-3, batch=128)
    mask = torch.ones(n, 2, dtype=torch.bool)
    for _ in range(150):
        x = torch.randn(n, 4)
        call = chooser.choose(x, mask)
        learner.decide(torch.arange(n), x, mask, call)
        right = (call == 0) == (x[:, 0] > 0)
        learner.pay(right.float(), torch.ones(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool))
        learner.update()
    chooser.eval()
    test = torch.randn(2000, 4)
    accuracy = ((chooser.choose(test, torch.ones(2000, 2, dtype=torch.bool)) == 0) == (test[:, 0] > 0)).float().mean()
    assert accuracy > 0.95, accuracy


def test_a_run_learns_saves_and_evaluates_its_chooser_with_the_policy(tmp_path):
    """A short PPO run on Errands, acted by the expert so that episodes end in success: the policy holds the
    chooser, the training env learns it from the decisions, the checkpoint holds its weights and `roborl eval`
    loads them; Ray env workers are refused in one line."""
    from helpers import ROOT, roborl_in_process

    from roborl import tasks
    from roborl.checkpoint import Checkpoint
    from roborl.config import load_config
    from roborl.errors import UserError
    from roborl.policies.act import Act
    from roborl.rm import HierarchyEnv
    from roborl.runner import Runner
    from roborl.sim.wrapper import find_wrapper

    overrides = ["env.num_envs=16", "train.total_steps=3200", "train.rollout_steps=50", "train.eval_episodes=8",
                 "train.eval_every=2", f"train.run_dir={tmp_path}", "train.name=choice", "train.progress=false",
                 "train.video=false", "policy.hidden=[16]"]
    runner = Runner(load_config(ROOT / "configs" / "hrm_errands_options.yaml", overrides))
    hierarchy = find_wrapper(runner.env, HierarchyEnv)
    assert hierarchy.chooser is runner.policy.call_chooser and hierarchy.call_learner is not None
    hierarchy.call_learner.batch = 32
    expert = tasks.EXPERTS["mujoco/Errands"](runner.env.unwrapped)

    def act(obs):
        expert.reset(runner.env.unwrapped.elapsed == 0)  # episodes that just started
        return Act(expert.act(obs), torch.zeros(16), torch.zeros(16))

    runner.algo.act = act
    before = [p.detach().clone() for p in runner.policy.call_chooser.parameters()]
    runner.train()
    assert hierarchy.call_learner.size > 0 and hierarchy.call_learner.updates > 0
    assert find_wrapper(runner.eval_env, HierarchyEnv).chooser is runner.policy.call_chooser
    after = list(runner.policy.call_chooser.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before))
    assert not any(p in runner.algo.optimizer.state for p in after)  # PPO's optimizer leaves the chooser alone
    saved = Checkpoint(tmp_path / "choice" / "checkpoints" / "last.safetensors").policy_state
    torch.testing.assert_close(saved["call_chooser.q.0.weight"], runner.policy.call_chooser.q[0].weight)
    evaluated = roborl_in_process("eval", str(tmp_path / "choice" / "checkpoints" / "last.safetensors"),
                                  "--episodes", "4")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    with pytest.raises(UserError, match="has choice states, whose calls are learned in the process that steps"):
        Runner(load_config(ROOT / "configs" / "hrm_errands_options.yaml",
                           [*overrides, "resources.env_workers=2", "train.name=ray"]))
