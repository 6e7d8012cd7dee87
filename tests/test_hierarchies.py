"""Hierarchies of reward machines: the batched call stack equals the one-env reference on random label
traces (nested calls and returns, in one step and across steps), flattening gives the flat machine one would
write by hand, the text format and the builder agree, and malformed hierarchies are refused in one line."""
import random

import pytest
import torch

from roborl.rm import CompiledRM, RewardMachine, RMBuilder, load_machine
from roborl.rm.hierarchy import FAILED, CompiledHierarchy, Hierarchy, flatten, sequence

LABELS = ["a", "b", "c", "h"]


def three_levels() -> Hierarchy:
    """root calls `pair` twice, then needs c; `pair` calls `leaf` (a then b), after which b must be off once;
    `leaf` fails on the hazard h. A call whose context holds starts its callee on the same labels."""
    leaf = (RMBuilder("l0").edge("l0", "l1", "a", 0.1).edge("l1", "l2", "b & !h", 0.2).edge("l1", "bad", "h")
            .accepting("l2").failing("bad").build())
    pair = RMBuilder("p0").call("p0", "p1", "leaf", "a", 0.5).edge("p1", "p2", "!b", 0.3).accepting("p2").build()
    root = (RMBuilder("r0").call("r0", "r1", "pair", "true").call("r1", "r2", "pair", "!c", 1.0)
            .edge("r2", "done", "c", 2.0).accepting("done").build())
    return Hierarchy({"root": root, "pair": pair, "leaf": leaf}, "root")


TEXT = """
machine root
r0
[done]
(r0, r1, call pair, 'true', 0)
(r1, r2, call pair, '!c', 1)
(r2, done, 'c', 2)
machine pair
p0
[p2]
(p0, p1, call leaf, 'a', 0.5)
(p1, p2, '!b', 0.3)
machine leaf   # fails on the hazard
l0
[l2, bad]
[bad]
(l0, l1, 'a', 0.1)
(l1, l2, 'b & !h', 0.2)
(l1, bad, 'h', 0)
"""


def run_reference(h, trace):
    config = h.initial
    configs, rewards = [], []
    for labels in trace:
        config, r = h.step(config, set(labels))
        configs.append(config)
        rewards.append(r)
    return configs, rewards


def random_traces(n, length, seed, p=0.45):
    rng = random.Random(seed)
    return [[{name for name in LABELS if rng.random() < (0.1 if name == "h" else p)} for _ in range(length)]
            for _ in range(n)]


def test_the_batched_call_stack_equals_the_reference_on_random_traces():
    h = three_levels()
    compiled = CompiledHierarchy(h, LABELS)
    traces = random_traces(300, 30, seed=0)
    stack = compiled.reset(len(traces))
    expected = [run_reference(h, t) for t in traces]
    saw = {"deep": 0, "accept": 0, "fail": 0, "return": 0, "two_calls_in_one_step": 0}
    for t in range(30):
        labels = torch.tensor([[name in trace[t] for name in LABELS] for trace in traces])
        stack, reward = compiled.step(stack, labels)
        configs = compiled.configs(stack)
        for i in range(len(traces)):
            want_config, want_reward = expected[i][0][t], expected[i][1][t]
            assert configs[i] == want_config, (i, t)
            assert reward[i].item() == pytest.approx(want_reward), (i, t)
            before = expected[i][0][t - 1] if t else h.initial
            saw["deep"] += len(want_config) == 3
            saw["return"] += want_config != FAILED and len(want_config) < len(before)
            saw["two_calls_in_one_step"] += len(before) == 1 and len(want_config) == 3  # root → pair → leaf
        accepts = compiled.accepts(stack)
        assert accepts.tolist() == [h.accepts(expected[i][0][t]) for i in range(len(traces))]
        saw["accept"] += int(accepts.sum())
        saw["fail"] += int(stack["failed"].sum())
    assert all(saw.values()), saw  # the traces exercised nested calls, returns, acceptance and failure


def test_every_options_counterfactual_step_is_what_the_real_call_stack_does():
    """Counterfactual experience across options: each option stepped alone on a step's labels (its callers
    replaced) pays, ends and moves on exactly as the real stacks do wherever that option is the one running,
    on random traces through nested calls, returns, acceptance and failure."""
    from roborl.rm.hierarchy_env import Options

    compiled = CompiledHierarchy(three_levels(), LABELS)
    options = Options(compiled)
    position = {int(o): i for i, o in enumerate(options.runnable)}
    traces = random_traces(300, 30, seed=1)
    n = len(traces)
    stack = compiled.reset(n)
    seen, ended_seen = set(), 0
    for t in range(30):
        labels = torch.tensor([[name in trace[t] for name in LABELS] for trace in traces])
        running = ~(stack["failed"] | compiled.accepts(stack))
        option = options.of(stack)
        after = compiled.step(stack, labels)[0]
        each = options.step_each(labels)
        for i in running.nonzero().flatten().tolist():
            row = position[int(option[i])] * n + i
            real_end = bool(after["returned"][i] | compiled.accepts(after)[i] | after["failed"][i])
            assert int(each["option"][row]) == int(option[i])
            assert float(each["own"][row]) == pytest.approx(float(after["own"][i])), (i, t)
            assert bool(each["ended"][row]) == real_end, (i, t, options.names[int(option[i])])
            if not real_end:
                assert int(each["next"][row]) == int(options.of(after)[i]), (i, t)
            seen.add(int(option[i]))
            ended_seen += real_end
        stack = after
    # every option ran but leaf.l0, which a stack never rests in: `pair` calls leaf on `a`, which moves it on at once
    assert set(options.runnable.tolist()) - seen == {options.names.index("leaf.l0")} and ended_seen > 100


def test_flattening_gives_the_flat_machine_written_by_hand():
    leaf = RMBuilder("l0").edge("l0", "l1", "a", 1.0).edge("l1", "l2", "b").accepting("l2").build()
    root = RMBuilder("r0").call("r0", "r1", "leaf", "true").call("r1", "r2", "leaf", "true", 5.0).accepting("r2").build()
    h = Hierarchy({"root": root, "leaf": leaf}, "root")
    by_hand = (RMBuilder("u0").edge("u0", "u1", "a", 1.0).edge("u1", "u2", "b").edge("u2", "u3", "a", 1.0)
               .edge("u3", "u4", "b", 5.0).accepting("u4").build())
    flat = flatten(h)
    assert flat.equivalent(by_hand, ["a", "b"])
    assert not flat.equivalent(RMBuilder("u0").edge("u0", "u1", "a & b", 7.0).accepting("u1").build(), ["a", "b"])
    assert {"root.r0", "root.r1/leaf.l1", "root.r2"} <= set(flat.states)  # configurations: the stack, innermost last


def test_the_flat_machine_and_the_hierarchy_step_alike_in_batches():
    h = three_levels()
    flat = flatten(h)
    assert flat.failing == {"failed"} and len(flat.accepting) == 1
    compiled_h, compiled_flat = CompiledHierarchy(h, LABELS), CompiledRM(flat, LABELS)
    traces = random_traces(200, 25, seed=1)
    stack, u = compiled_h.reset(len(traces)), torch.full((len(traces),), compiled_flat.initial)
    for t in range(25):
        labels = torch.tensor([[name in trace[t] for name in LABELS] for trace in traces])
        stack, r_h = compiled_h.step(stack, labels)
        u, r_flat = compiled_flat.step(u, labels)
        torch.testing.assert_close(r_h, r_flat)
        assert compiled_h.accepts(stack).tolist() == compiled_flat.accepting[u].tolist()
        assert stack["failed"].tolist() == [flat.states[i] == "failed" for i in u.tolist()]


def test_the_text_format_and_the_builder_agree():
    from_text = Hierarchy.from_text(TEXT)
    assert from_text.depth == 3 and from_text.root == "root"
    assert flatten(from_text).equivalent(flatten(three_levels()), LABELS)
    config, reward = from_text.step(from_text.initial, {"a"})  # root calls pair, pair calls leaf, leaf reads a
    assert config == (("root", "r1", 0.0), ("pair", "p1", 0.5), ("leaf", "l1", 0.0)) and reward == pytest.approx(0.1)
    assert from_text.step(config, {"h"}) == (FAILED, 0.0)  # the leaf's hazard fails the whole hierarchy


def test_an_ltlf_task_splits_into_called_sub_formulas():
    h = sequence(["F(a)", "F(b & !a)", "F(c)"])
    assert h.depth == 2 and len(h.machines) == 4
    config, total, done = h.initial, 0.0, False
    for labels in [set(), {"a"}, {"a", "b"}, {"b"}, {"c"}]:
        config, r = h.step(config, labels)
        total += r
        done = h.accepts(config)
    assert done and total == pytest.approx(4.0)  # each sub-formula pays 1 as it holds, the root 1 at the end
    config, _ = h.step(h.initial, {"a"})
    assert not h.accepts(h.step(config, {"c"})[0])  # c before b does not finish the task


@pytest.mark.parametrize("machines,root,message", [
    ({"root": RMBuilder("r0").call("r0", "r1", "nope").accepting("r1").build()}, "root", "'nope', which is not defined"),
    ({"root": RMBuilder("r0").call("r0", "r1", "x").accepting("r1").build(),
      "x": RMBuilder("x0").call("x0", "x1", "root").accepting("x1").build()}, "root", "calls may not recurse"),
    ({"root": RMBuilder("r0").call("r0", "r1", "x").accepting("r1").build(),
      "x": RMBuilder("x0").edge("x0", "x1", "a").build()}, "root", "never accepts"),
    ({"root": RMBuilder("r0").edge("r0", "r1", "a").build()}, "main", "root 'main' is not one of"),
])
def test_malformed_hierarchies_are_refused(machines, root, message):
    with pytest.raises(ValueError, match=message):
        Hierarchy(machines, root)


def test_a_call_and_an_edge_that_both_hold_are_refused():
    leaf = RMBuilder("l0").edge("l0", "l1", "b").accepting("l1").build()
    root = RMBuilder("r0").call("r0", "r1", "leaf", "a").edge("r0", "r2", "a & b").accepting("r1", "r2").build()
    with pytest.raises(ValueError, match="not deterministic"):
        CompiledHierarchy(Hierarchy({"root": root, "leaf": leaf}, "root"), ["a", "b"])
    with pytest.raises(ValueError, match="step it as a hierarchy"):
        root.step("r0", {"a"})
    with pytest.raises(ValueError, match="starts with `machine NAME`"):
        Hierarchy.from_text("r0\n[r1]\n(r0, r1, 'a', 1)")
    assert RewardMachine.from_text("0\n[1]\n(0, 1, call sub, 'a', 1)").calls == {"sub"}


def test_env_rm_machine_takes_a_hierarchy_file_as_its_flat_machine(tmp_path):
    path = tmp_path / "three_levels.rm"
    path.write_text("# a hierarchy for the flat learner\n" + TEXT)
    flat = load_machine(str(path))
    assert flat.equivalent(flatten(three_levels()), LABELS) and not flat.calls
    path.write_text("machine root\nr0\n[r1]\n(r0, r1, call missing, 'a', 1)\n")
    with pytest.raises(ValueError, match=r"three_levels.rm: hierarchy: machine 'root' calls 'missing'"):
        load_machine(str(path))


def with_terms() -> Hierarchy:
    """`touch` pays the term `near` while it waits and 2 when it accepts; the root pays `far` before calling."""
    touch = RMBuilder("t0").edge("t0", "t0", "!a", "near").edge("t0", "t1", "a", 2.0).accepting("t1").build()
    root = (RMBuilder("r0").edge("r0", "r0", "!b", "far").call("r0", "r1", "touch", "b", 0.5)
            .call("r1", "r2", "touch", "c", 1.0).accepting("r2").build())
    return Hierarchy({"root": root, "touch": touch}, "root")


def test_reward_terms_are_paid_alike_by_the_reference_the_batched_stack_and_the_flat_machine():
    h = with_terms()
    terms = ["near", "far"]
    flat = flatten(h)
    compiled_h, compiled_flat = CompiledHierarchy(h, LABELS, terms), CompiledRM(flat, LABELS, terms)
    traces = random_traces(200, 20, seed=2)
    values = torch.rand(20, len(traces), len(terms))
    stack, u = compiled_h.reset(len(traces)), torch.full((len(traces),), compiled_flat.initial)
    configs = [h.initial] * len(traces)
    paid_terms = own_terms = 0
    for t in range(20):
        labels = torch.tensor([[name in trace[t] for name in LABELS] for trace in traces])
        before = compiled_h.configs(stack)
        stack, r_h = compiled_h.step(stack, labels, values[t])
        u, r_flat = compiled_flat.step(u, labels, values[t])
        torch.testing.assert_close(r_h, r_flat)
        for i, trace in enumerate(traces):
            configs[i], r = h.step(configs[i], trace[t], dict(zip(terms, values[t, i].tolist())))
            assert r_h[i].item() == pytest.approx(r, abs=1e-6)
            _, own, _, returned = h.transition(before[i], trace[t])
            own_value = values[t, i, terms.index(own)].item() if isinstance(own, str) else own
            assert stack["own"][i].item() == pytest.approx(own_value, abs=1e-6) and stack["returned"][i] == returned
            paid_terms += isinstance(own, str) and own_value > 0
            own_terms += returned
        assert compiled_h.configs(stack) == configs
    assert paid_terms and own_terms  # both kinds of step were exercised


def test_a_term_on_an_edge_that_returns_or_calls_is_refused():
    touch = RMBuilder("t0").edge("t0", "t1", "a", "near").accepting("t1").build()
    root = RMBuilder("r0").call("r0", "r1", "touch", "true").accepting("r1").build()
    with pytest.raises(ValueError, match="'touch' pays the reward term 'near' on an edge that calls or returns"):
        Hierarchy({"root": root, "touch": touch}, "root")
    with pytest.raises(ValueError, match="pays reward terms \\['far', 'near'\\] that the env does not publish"):
        CompiledHierarchy(with_terms(), LABELS)


def expert_through_hierarchy(env_id: str, machine: str, n: int, seed: int):
    """The task's expert, one episode per env, acting through the option learner's view of `tasks/<machine>`:
    checks at every step that the observation carries the acting option's one-hot, that a returning option is
    paid 1 and nothing else that step, and that the hierarchy's acceptance ends each episode with the task's
    success. (the env, each env's touch options in the order it passed through them, its returns, and the
    reward paid between returns)"""
    from helpers import ROOT

    from roborl import sim, tasks
    from roborl.rm import HierarchyEnv, load_hierarchy

    base = sim.make(env_id, n, seed=seed)
    env, expert = HierarchyEnv(base, load_hierarchy(str(ROOT / "tasks" / machine))), tasks.EXPERTS[env_id](base)
    obs = env.reset(seed=seed)
    width = base.observation_space["state"].shape[0]
    assert obs["state"].shape[1] == width + env.num_options
    names = env.option_names
    touches, returns, approach = [[] for _ in range(n)], torch.zeros(n), torch.zeros(n)
    finished = torch.zeros(n, dtype=torch.bool)
    for _ in range(base.max_episode_steps):
        option = obs["rm_state"].clone()
        assert (obs["state"][torch.arange(n), width + option] == 1).all()
        obs, reward, term, trunc, info = env.step(expert.act(obs))
        expert.reset(term | trunc)
        for i in (~finished).nonzero().flatten().tolist():
            name = names[int(option[i])]
            if name.startswith("touch") and (not touches[i] or touches[i][-1] != name):
                touches[i].append(name)
        ended = info["option_end"] & ~finished
        assert (reward[ended] == 1.0).all()  # a touch machine pays 1 where it returns, nothing else that step
        returns += ended.float()
        approach += torch.where(ended | finished, torch.zeros_like(reward), reward)
        assert info["success"][term].all() and info["rm_accepted"][term].all()
        finished |= term
        if finished.all():
            break
    assert finished.all(), f"the expert finished every {env_id} episode"
    return env, touches, returns, approach


TOUR = ["touch_a.0", "touch_b.0", "touch_a.0", "touch_c.0", "touch_a.0", "touch_b.0"]


def test_the_option_learner_sees_the_innermost_machine_and_is_paid_its_own_reward():
    """The expert tours red, blue, red, yellow, red, blue: the options it passes through are the three touch
    machines (touch_a three times), each call's option ends where it returns and pays 1 there, and the
    hierarchy's acceptance ends the episode with the task's success."""
    env, touches, returns, approach = expert_through_hierarchy("mujoco/Tour", "tour.rm", 4, 0)
    assert env.num_options == 7 + 2 * 3
    assert touches == [TOUR] * 4
    assert (returns == 6).all() and (approach > 0.5).all()  # the approach terms paid progress on the way


def test_grand_tour_is_tours_touch_options_three_laps_over():
    """GrandTour's hierarchy (root -> lap -> touch): the touch options the expert passes through are Tour's
    three, 18 times in Tour's order (a caller acts only in the step that makes its next call), while the flat
    machine the flat learner sees has 37 configurations."""
    from helpers import ROOT

    from roborl.rm import load_hierarchy

    flat = {name: len(flatten(load_hierarchy(str(ROOT / "tasks" / name))).states) for name in ("grand_tour.rm", "tour.rm")}
    assert flat == {"grand_tour.rm": 37, "tour.rm": 13}
    _, touches, returns, _ = expert_through_hierarchy("mujoco/GrandTour", "grand_tour.rm", 3, 1)
    assert touches == [TOUR * 3] * 3
    assert (returns == 18).all()


def test_option_learner_config_errors(tmp_path):
    from helpers import ROOT

    from roborl.builder import make_env
    from roborl.config import config_from_dict
    from roborl.errors import UserError

    tour = {"env": {"id": "mujoco/Tour", "num_envs": 4, "rm": {"machine": str(ROOT / "tasks" / "tour.rm"),
                                                                "learner": "options"}}}
    with pytest.raises(UserError, match="set train.algorithm ppo or sac \\(not grpo\\)"):
        config_from_dict({**tour, "train": {"algorithm": "grpo"}})
    with pytest.raises(UserError, match="leave shaping_gamma unset"):
        config_from_dict({"env": {**tour["env"], "rm": {**tour["env"]["rm"], "shaping_gamma": 0.9}}})
    cfg = config_from_dict({"env": {**tour["env"], "rm": {"machine": str(ROOT / "tasks" / "sequence.rm"),
                                                            "learner": "options"}}})
    with pytest.raises(UserError, match="sequence.rm is a flat machine"):
        make_env(cfg.env, 2, 0, torch.device("cpu"))


def test_ppo_ends_an_options_return_where_its_machine_returns(tmp_path):
    """One PPO rollout on Tour with the option learner, acted by the expert (so calls do return): the buffer's
    episode ends are the env's ends plus the steps where a touch machine returned, and the rewards are each
    option's own (1 where it returns)."""
    from helpers import ROOT

    from roborl import tasks
    from roborl.collect import EpisodeLog
    from roborl.config import load_config
    from roborl.policies.act import Act
    from roborl.runner import Runner

    cfg = load_config(ROOT / "configs" / "hrm_tour_options.yaml", [
        f"train.run_dir={tmp_path}", "train.name=options", "env.num_envs=4", "train.rollout_steps=60",
        "train.progress=false", "train.video=false", "policy.hidden=[16]"])
    runner = Runner(cfg)
    expert = tasks.EXPERTS["mujoco/Tour"](runner.env.unwrapped)
    runner.algo.act = lambda obs: Act(expert.act(obs), torch.zeros(4), torch.zeros(4))
    seen = []
    step = runner.env.step

    def recording_step(action):
        out = step(action)
        seen.append((out[4]["option_end"].clone(), (out[2] | out[3]).clone()))
        return out

    runner.env.step = recording_step
    runner.obs = runner.algo.collect(runner.env, runner.env.reset(seed=0), EpisodeLog())
    buffer = runner.algo.buffer
    option_end = torch.stack([o for o, _ in seen])
    episode_end = torch.stack([d for _, d in seen])
    assert option_end.sum() >= 8  # the expert's touches returned
    assert torch.equal(buffer.dones.bool().cpu(), option_end | episode_end)
    assert (buffer.rewards.cpu()[option_end] == 1.0).all()
    runner.close()


def sac_on_tour(tmp_path, crm: bool):
    """A SAC runner on Tour with the option learner, acted by the expert (so calls do return), after one
    collection of 4 envs × 30 steps; each step's option ends and episode ends as the env reported them."""
    from helpers import ROOT

    from roborl import tasks
    from roborl.collect import EpisodeLog
    from roborl.config import load_config
    from roborl.policies.act import Act
    from roborl.runner import Runner

    cfg = load_config(ROOT / "configs" / "hrm_tour_options_sac.yaml", [
        f"train.run_dir={tmp_path}", "train.name=sac", "env.num_envs=4", "train.rollout_steps=30",
        f"sac.crm={str(crm).lower()}", "sac.seed_steps=0", "sac.batch_size=8",
        "sac.critic_hidden=[16]", "train.progress=false", "train.video=false", "policy.hidden=[16]"])
    runner = Runner(cfg)
    expert = tasks.EXPERTS["mujoco/Tour"](runner.env.unwrapped)
    runner.algo.act = lambda obs: Act(expert.act(obs), torch.zeros(4))
    seen = []
    step = runner.env.step

    def recording_step(action):
        out = step(action)
        seen.append((out[4]["option_end"].clone(), out[2].clone()))
        return out

    runner.env.step = recording_step
    runner.algo.collect(runner.env, runner.env.reset(seed=0), EpisodeLog())
    return runner, torch.stack([o for o, _ in seen]), torch.stack([t for _, t in seen])


def test_sac_ends_an_options_target_where_its_machine_returns(tmp_path):
    runner, option_end, terminated = sac_on_tour(tmp_path, crm=False)
    replay = runner.algo.replay
    assert len(replay) == 30 * 4 and option_end.sum() >= 4  # the expert's touches returned
    stored = replay.data["terminated"][:len(replay)].bool().cpu().view(30, 4)
    assert torch.equal(stored, option_end | terminated)
    runner.close()


def test_sac_with_crm_learns_every_option_from_every_step(tmp_path):
    runner, option_end, _ = sac_on_tour(tmp_path, crm=True)
    replay, options = runner.algo.replay, runner.env.options
    runnable = len(options.runnable)
    assert runnable == 6 + 3  # the root's states before acceptance and each touch machine's start
    assert len(replay) == 30 * 4 * runnable
    onehots = replay.data["obs.state"][:len(replay), -options.count:]
    assert (onehots.sum(-1) == 1).all() and torch.equal(onehots.sum(0)[options.runnable], torch.full((runnable,), 120.0))
    touch = [options.names.index(f"touch_{x}.0") for x in "abc"]
    ended = replay.data["terminated"][:len(replay)].bool()
    # a touch option's row ends wherever its target is touched, whichever option was acting: at least at every
    # real return, and more often (touching red while the blue option acts ends red's row too)
    touch_rows_ended = sum(int(ended[onehots[:, t] == 1].sum()) for t in touch)
    assert touch_rows_ended > option_end.sum() >= 4, (touch_rows_ended, int(option_end.sum()))
    runner.close()


def test_per_machine_actors_act_and_learn_only_where_their_machine_runs(tmp_path):
    """policy.actors per_machine: the row's machine picks whose actor acts, only that actor gets gradients
    from the row, and a PPO run trains, saves and evaluates through the CLI; without a hierarchy learned
    by options, or with a policy kind of one actor, the key is refused in one line."""
    from helpers import ROOT, roborl_in_process

    from roborl import sim
    from roborl.builder import make_policy
    from roborl.config import config_from_dict
    from roborl.errors import UserError
    from roborl.rm import HierarchyEnv, load_hierarchy

    env = HierarchyEnv(sim.make("mujoco/Tour", 6, seed=0), load_hierarchy(str(ROOT / "tasks" / "tour.rm")))
    cfg = config_from_dict({"policy": {"kind": "gaussian", "actors": "per_machine", "hidden": [16]}}).policy
    policy = make_policy(cfg, env)
    assert len(policy.actor.nets) == 4  # root, touch_a, touch_b, touch_c
    obs = env.reset(seed=0)
    options = env.options
    for row, name in enumerate(["touch_a.0", "touch_b.0", "touch_c.0", "root.s1", "touch_a.0", "touch_c.0"]):
        obs["state"][row, -options.count:] = 0.0
        obs["state"][row, -options.count + options.names.index(name)] = 1.0
    x = policy.features(obs)
    machines = [1, 2, 3, 0, 1, 3]
    inputs = x[:, :-4]
    for row, m in enumerate(machines):
        assert torch.allclose(policy.actor(x)[row], policy.actor.nets[m](inputs[row:row + 1])[0])
    policy.zero_grad()
    policy.actor(x)[[1]].sum().backward()  # a touch_b row: only touch_b's actor learns from it
    grads = [sum(float(p.grad.abs().sum()) for p in net.parameters() if p.grad is not None) for net in policy.actor.nets]
    assert grads[2] > 0 and grads[0] == grads[1] == grads[3] == 0
    env.close()

    run = roborl_in_process("train", str(ROOT / "configs" / "hrm_tour_options.yaml"), "policy.actors=per_machine",
                            "env.num_envs=8", "train.total_steps=800", "train.rollout_steps=50", "train.eval_episodes=4",
                            f"train.run_dir={tmp_path}", "train.name=pm", "train.progress=false", "train.video=false")
    assert run.returncode == 0, run.stderr[-2000:]
    evaluated = roborl_in_process("eval", str(tmp_path / "pm" / "checkpoints" / "last.safetensors"), "--episodes", "4")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    with pytest.raises(UserError, match="policy.actors per_machine trains one actor per machine"):
        make_policy(cfg, sim.make("mujoco/Tour", 2, seed=0))
    flow = roborl_in_process("train", str(ROOT / "configs" / "hrm_tour_options.yaml"), "policy.kind=flow",
                             f"train.run_dir={tmp_path}", "train.name=flow", "train.progress=false")
    assert flow.returncode == 2 and "'policy.actors' is not read by policy.kind flow" in flow.stderr, flow.stderr
    assert not (tmp_path / "flow").exists()
