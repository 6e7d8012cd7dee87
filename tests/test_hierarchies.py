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
