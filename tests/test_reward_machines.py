"""Reward machines: three syntaxes, tensor stepping vs the reference semantics, potential-based
shaping, LTLf compilation, the env wrapper (machine state, rewards, episode ends) and CRM."""
import itertools

import pytest
import torch
from helpers import ROOT

from roborl import sim, tasks
from roborl.builder import make_env
from roborl.config import config_from_dict
from roborl.errors import UserError
from roborl.rm import CompiledRM, RewardMachine, RewardMachineEnv, RMBuilder
from roborl.rm.formula import FormulaError, evaluate, parse
from roborl.rm.ltlf import from_ltlf

SEQUENCE_RM = ROOT / "tasks" / "sequence.rm"


def traces(labels, max_len):
    combos = [frozenset(c) for r in range(len(labels) + 1) for c in itertools.combinations(labels, r)]
    for n in range(1, max_len + 1):
        yield from itertools.product(combos, repeat=n)


def run(rm, trace):
    u, total = rm.initial, 0.0
    for step in trace:
        u, r = rm.step(u, set(step))
        total += r
    return u, total


def test_formula_parser():
    assert evaluate(parse("a & !b | (c & ~d)"), {"a"})
    assert not evaluate(parse("a & !b | (c & ~d)"), {"a", "b"})
    assert evaluate(parse("!(a | b) & true"), set())
    for bad in ("", "a &", "(a", "a b", "a $ b"):
        with pytest.raises(FormulaError):
            parse(bad)


def test_three_syntaxes_give_the_same_machine():
    builder = (RMBuilder("u0").edge("u0", "u1", "a & !b").edge("u0", "done", "a & b", 1)
               .edge("u1", "done", "b", 1).accepting("done").build())
    text = RewardMachine.from_text("""
        0      # initial
        [2]    # terminal
        (0, 0, '!a', 0)
        (0, 1, 'a&!b', 0)
        (0, 2, 'a&b', ConstantRewardFunction(1))
        (1, 1, '!b', 0)
        (1, 2, 'b', 1)""")
    ltl = from_ltlf("F(a & F(b))")
    assert builder.equivalent(text, ["a", "b"]) and text.equivalent(ltl, ["a", "b"])
    wrong = RMBuilder("u0").edge("u0", "u1", "a").edge("u1", "done", "b", 1).accepting("done").build()
    assert not wrong.equivalent(ltl, ["a", "b"])  # a and b in the same step: LTLf accepts, this one waits
    # with a failing terminal state (our text extension: a bracketed line of failing states)
    until_text = RewardMachine.from_text("0\n[1, 2]\n[2]\nunmatched: stay\n(0,1,'goal',1)\n(0,2,'bad & !goal',0)")
    until_builder = (RMBuilder("s").edge("s", "win", "goal", 1).edge("s", "lose", "bad & !goal")
                     .accepting("win").failing("lose").build())
    until_ltl = from_ltlf("!bad U goal")
    assert until_text.equivalent(until_builder, ["bad", "goal"]) and until_text.equivalent(until_ltl, ["bad", "goal"])
    assert until_ltl.failing and until_ltl.accepting


# An office-world machine in the original text format: get coffee (f), then reach the office (g); every edge
# is guarded by !n, so touching a decoration (n) matches no edge.
OFFICE_COFFEE = """
0 # initial state
[2] # terminal state
(0,0,'!f&!n',ConstantRewardFunction(0))
(0,1,'f&!n',ConstantRewardFunction(0))
(1,1,'!g&!n',ConstantRewardFunction(0))
(1,2,'g&!n',ConstantRewardFunction(1))
"""


def test_the_original_format_keeps_the_original_semantics():
    """Read as the original code reads it, a step that matches no edge sends the machine to a terminal failure
    with reward 0 (a decoration ends the episode); with roborl's `unmatched: stay` the machine ignores it.
    The compiled, batched machine agrees with the one-env reference on both."""
    original = RewardMachine.from_text(OFFICE_COFFEE)
    assert original.failing == {"unmatched"} and original.accepting == {"2"}
    trace = [set(), {"f"}, {"n"}, {"g"}]
    assert run(original, trace) == ("unmatched", 0.0)
    assert run(original, [set(), {"f"}, set(), {"g"}]) == ("2", 1.0)
    lenient = RewardMachine.from_text(OFFICE_COFFEE.replace("[2] # terminal state", "[2]\nunmatched: stay"))
    assert lenient.failing == set() and run(lenient, trace) == ("2", 1.0)
    labels = ["f", "g", "n"]
    for rm in (original, lenient):
        compiled = CompiledRM(rm, labels)
        state = torch.full((4,), rm.states.index(rm.initial))
        steps = [[set(), {"f"}, {"f"}, set()], [{"n"}, {"n"}, {"g"}, {"f"}], [{"g"}, {"g"}, {"n"}, {"g"}]]
        reference = [rm.initial] * 4
        for step in steps:
            labels_t = torch.tensor([[name in s for name in labels] for s in step])
            state, reward = compiled.step(state, labels_t)
            for i, s in enumerate(step):
                reference[i], r = rm.step(reference[i], s)
                assert rm.states[int(state[i])] == reference[i] and float(reward[i]) == pytest.approx(r)
    # a machine whose guards cover every label set gains no failure state: the two semantics coincide
    assert RewardMachine.from_file(SEQUENCE_RM).states == ["0", "1", "2", "3"]


def test_ltlf_compile_accepts_exactly_the_satisfying_traces():
    rm = from_ltlf("F(a & F(b))")
    for trace in traces(["a", "b"], 4):
        satisfied = any("a" in trace[i] and any("b" in trace[j] for j in range(i, len(trace))) for i in range(len(trace)))
        u, total = run(rm, trace)
        assert (u in rm.accepting) == satisfied, trace
        assert total == (1.0 if satisfied else 0.0)


def test_compiled_stepping_equals_the_reference_on_random_labels():
    rm = RewardMachine.from_file(SEQUENCE_RM)
    labels, terms = ["at_a", "at_b", "at_c"], ["approach_a", "approach_b", "approach_c"]
    compiled = CompiledRM(rm, labels, terms)
    g = torch.Generator().manual_seed(0)
    N, T = 64, 60
    u = torch.full((N,), compiled.initial)
    ref = [rm.initial] * N
    for _ in range(T):
        lab = torch.rand(N, 3, generator=g) < 0.3
        term_values = torch.rand(N, 3, generator=g)
        nxt, reward = compiled.step(u, lab, term_values)
        for i in range(N):
            true = {n for n, on in zip(labels, lab[i].tolist()) if on}
            ref_next, ref_r = rm.step(ref[i], true)
            ref_r = float(term_values[i, terms.index(ref_r)]) if isinstance(ref_r, str) else ref_r
            assert rm.states[int(nxt[i])] == ref_next
            assert float(reward[i]) == pytest.approx(ref_r)
            ref[i] = ref_next
        u = nxt
    assert compiled.terminal[u].any()  # the random labels did complete the sequence somewhere


def test_nondeterministic_machine_is_refused():
    rm = RMBuilder().edge("u0", "u1", "a").edge("u0", "u2", "b").build()
    with pytest.raises(ValueError, match="not deterministic"):
        CompiledRM(rm, ["a", "b"])


def test_shaping_is_potential_based_on_a_tabular_example():
    """A corridor 0..4; `a` holds at 0, `b` at 4; the RM of F(a & F(b)). Optimal policies of the product
    MDP are the same with and without the machine's shaping, and shaped returns telescope."""
    rm = from_ltlf("F(a & F(b))")
    compiled = CompiledRM(rm, ["a", "b"])
    gamma = 0.9
    phi = compiled.values(gamma)
    positions, moves = range(5), (-1, 0, 1)

    def labels(p):
        return torch.tensor([[p == 0, p == 4]])

    def q_values(shaped):
        V = torch.zeros(5, compiled.num_states)
        for _ in range(500):
            Q = torch.zeros(5, compiled.num_states, 3)
            for p, u, (k, m) in itertools.product(positions, range(compiled.num_states), enumerate(moves)):
                if compiled.terminal[u]:
                    continue
                p2 = min(max(p + m, 0), 4)
                u2, r = compiled.step(torch.tensor([u]), labels(p2))
                u2, r = int(u2), float(r)
                done = bool(compiled.terminal[u2])
                if shaped:
                    r += gamma * (0.0 if done else float(phi[u2])) - float(phi[u])
                Q[p, u, k] = r + (0.0 if done else gamma * V[p2, u2])
            V = Q.max(-1).values
        return Q

    plain, shaped = q_values(False), q_values(True)
    live = ~compiled.terminal
    assert not torch.equal(plain, shaped)
    for p in positions:
        for u in live.nonzero().flatten().tolist():
            best = plain[p, u].max()
            assert set((plain[p, u] > best - 1e-6).nonzero().flatten().tolist()) == \
                set((shaped[p, u] > shaped[p, u].max() - 1e-6).nonzero().flatten().tolist())
            torch.testing.assert_close(shaped[p, u], plain[p, u] - phi[u])  # Q' = Q − Φ(u)


def sequence_env(n, machine=None, **kwargs):
    env = sim.make("mujoco/Sequence", n, seed=0)
    return RewardMachineEnv(env, machine or RewardMachine.from_file(SEQUENCE_RM), **kwargs), tasks.EXPERTS["mujoco/Sequence"](env)


def test_wrapper_adds_machine_state_and_ends_episodes_at_terminal_states():
    env, expert = sequence_env(8)
    obs = env.reset(seed=0)
    assert obs["state"].shape[1] == sim.make("mujoco/Sequence", 1).observation_space["state"].shape[0] + 4
    assert (obs["state"][:, -4:] == torch.tensor([1.0, 0, 0, 0])).all()
    seen_states, ended = set(), False
    for _ in range(100):
        obs, reward, term, trunc, info = env.step(expert.act(obs))
        expert.reset(term | trunc)
        seen_states |= set(info["rm_state"].tolist())
        if term.any():
            ended = True
            assert info["rm_accepted"][term].all() and (info["final_obs"]["rm_state"][term] == 3).all()
            assert (obs["rm_state"][term] == 0).all()  # a new episode starts in the initial state
            assert (reward[term] == 1.0).all()  # the last edge pays 1 (replace mode)
    assert ended and seen_states == {0, 1, 2, 3}


def test_machine_ends_episodes_the_task_would_not_end():
    """F(at_a) accepts on touching A, long before the task's own end (all three targets)."""
    env, expert = sequence_env(4, from_ltlf("F(at_a)"))
    obs = env.reset(seed=0)
    for _t in range(60):
        obs, reward, term, trunc, info = env.step(expert.act(obs))
        expert.reset(term | trunc)
        if term.any():
            assert not info["success"][term].any() and (info["episode"]["length"][term] < 60).all()
            assert (info["labels"][term, 0]).all()  # at_a held when the machine accepted
            return
    pytest.fail("no episode ended at the machine's accepting state")


def test_shaped_rewards_telescope_over_an_episode():
    gamma = 0.9
    env, expert = sequence_env(16, shaping_gamma=gamma)
    plain_env, plain_expert = sequence_env(16)
    obs, pobs = env.reset(seed=3), plain_env.reset(seed=3)
    shaped_ret = torch.zeros(16)
    plain_ret = torch.zeros(16)
    alive = torch.ones(16, dtype=torch.bool)
    for t in range(100):
        obs, r, term, trunc, _ = env.step(expert.act(obs))
        pobs, pr, pterm, ptrunc, _ = plain_env.step(plain_expert.act(pobs))
        shaped_ret += alive * gamma ** t * r
        plain_ret += alive * gamma ** t * pr
        alive &= ~(term | trunc)
        if not alive.any():
            break
    assert not alive.any()  # every episode terminated (the expert completes the sequence)
    # Σ γ^t (r + γΦ(u') − Φ(u)) = Σ γ^t r − Φ(u0) when Φ = 0 at termination
    torch.testing.assert_close(shaped_ret, plain_ret - env.potential[0], atol=1e-4, rtol=1e-5)


def test_counterfactual_experience_matches_the_reference():
    env, _ = sequence_env(5)
    rm = RewardMachine.from_file(SEQUENCE_RM)
    state, next_state = torch.randn(5, 7), torch.randn(5, 7)
    labels = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    terms = torch.rand(5, 3)
    states, next_states, rewards, terminated = env.counterfactuals(state, next_state, labels, torch.zeros(5),
                                                                  torch.zeros(5, dtype=torch.bool), terms)
    assert states.shape == (3 * 5, 7 + 4)  # the three non-terminal machine states × 5 transitions
    for row in range(15):
        u, i = row // 5, row % 5
        true = {n for n, on in zip(["at_a", "at_b", "at_c"], labels[i].tolist()) if on}
        dst, r = rm.step(rm.states[u], true)
        r = float(terms[i, ["approach_a", "approach_b", "approach_c"].index(r)]) if isinstance(r, str) else r
        assert states[row, 7 + u] == 1 and next_states[row, 7 + rm.states.index(dst)] == 1
        assert float(rewards[row]) == pytest.approx(r) and bool(terminated[row]) == (dst in rm.terminal)
        torch.testing.assert_close(states[row, :7], state[i])


def test_reward_machine_config_errors(tmp_path):
    bad_label = tmp_path / "bad.rm"
    bad_label.write_text("0\n[1]\n(0, 1, 'at_z', 1)\n")
    cases = [({"machine": str(tmp_path / "missing.rm")}, "does not exist"),
             ({"machine": str(bad_label)}, "labels \\['at_z'\\]"),
             ({"machine": str(SEQUENCE_RM), "reward": "multiply"}, "rm.reward"),
             ({"machine": str(SEQUENCE_RM), "ltlf": "F(at_a)"}, "exactly one"),
             ({"ltlf": "F(at_a &"}, "does not parse")]
    for rm_cfg, message in cases:
        with pytest.raises((UserError, sim.SimError), match=message):
            cfg = config_from_dict({"env": {"id": "mujoco/Sequence", "rm": rm_cfg}})
            make_env(cfg.env, 2, 0, torch.device("cpu"))
    cfg = config_from_dict({"env": {"id": "mujoco/Reach", "rm": {"machine": str(SEQUENCE_RM)}}})
    with pytest.raises(sim.SimError, match="does not publish"):
        make_env(cfg.env, 2, 0, torch.device("cpu"))


def test_sac_with_crm_stores_every_machine_state(tmp_path):
    """Residual SAC on Sequence with the machine: each env step adds one transition per non-terminal
    machine state, the observed one among them."""
    from roborl.runner import Runner

    cfg = config_from_dict({
        "env": {"id": "mujoco/Sequence", "num_envs": 4, "rm": {"machine": str(SEQUENCE_RM), "shaping_gamma": 0.9}},
        "policy": {"kind": "residual", "hidden": [32]}, "residual": {"base": "expert", "scale": 0.2},
        "train": {"algorithm": "sac", "total_steps": 40, "rollout_steps": 10, "eval_every": 100, "eval_episodes": 4,
                  "eval_at_start": False, "progress": False, "video": False, "run_dir": str(tmp_path), "device": "cpu"},
        "sac": {"crm": True, "seed_steps": 0, "batch_size": 8}})
    trainer = Runner(cfg)
    trainer.train()
    replay = trainer.algo.replay
    assert len(replay) == 3 * 40  # 3 non-terminal machine states × 40 env steps
    onehots = replay.data["obs.state"][:len(replay), -4:]
    assert (onehots.sum(-1) == 1).all() and (onehots[:, :3].sum(0) == 40).all()
    assert replay.data["obs.base_action"].shape == (replay.capacity, 4)


@pytest.mark.learning
def test_ppo_with_the_machine_progresses_through_it(tmp_path):
    """A short real run: within 64k env steps PPO with the machine's state and shaping gets episodes
    well past the first target (mean final machine state), from about 0 at the start."""
    from helpers import roborl_in_process
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = roborl_in_process("train", str(ROOT / "configs" / "rm_sequence.yaml"), f"train.run_dir={tmp_path}", "train.name=rm",
                             "train.total_steps=64000", "train.eval_every=100", "train.progress=false", "train.video=false")
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc = EventAccumulator(str(tmp_path / "rm" / "tb"))
    acc.Reload()
    progress = [e.value for e in acc.Scalars("rollout/rm_final_state")]
    assert progress[0] < 0.5 and progress[-1] > 0.9, progress
