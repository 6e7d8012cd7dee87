"""The option learner's view of a hierarchy of reward machines (`env.rm.learner: options`).

HRMs are learned with one option per callable machine (Furelos-Blanco et al. 2023): the policy of a machine
is trained on that machine's own reward and ends when the machine returns, so a sub-task called several
times (touch A, then B, then A again) is one option, learned once. Here the options share one network: the
observation's `state` gets the one-hot of the innermost machine and its state (not the whole call stack,
which is what the flat learner sees through `flatten`), the reward is what that machine's own edges pay
(`CompiledHierarchy`'s `own`, reward terms included), and `info["option_end"]` marks the steps where a
call returned, which PPO and SAC treat as the end of a return (no bootstrap across it; the env goes on).

Where a stack rests in a choice state (several calls, roborl/rm/hierarchy.py), a call is chosen per env by the
policy's `CallChooser` (learned by SMDP Q-learning, roborl/rm/call_learning.py; uniformly at random where no
chooser is attached) and pursued until the stack moves on: the row acts as the chosen callee's first option
(its one-hot, its own reward as if it had been called), and that option ends where another callee starts.

`counterfactuals` gives off-policy learners (SAC with `sac.crm`) each env transition as seen from every option
that can run, as CRM does for a flat machine: a touch machine learns from every step, whichever option acted.
"""
from __future__ import annotations

import torch

from roborl.policies.call_chooser import CallChooser
from roborl.rm.call_learning import CallLearner
from roborl.rm.env import add_termination_hook, compile_for, state_space_plus
from roborl.rm.hierarchy import CompiledHierarchy, Hierarchy
from roborl.sim.batch import concat
from roborl.sim.errors import SimError
from roborl.sim.vec_env import Obs, VecEnv
from roborl.sim.wrapper import VecEnvWrapper


class Options:
    """The options of a compiled hierarchy: one per (machine, state), numbered machine by machine."""

    def __init__(self, machine: CompiledHierarchy) -> None:
        self.machine, h, device = machine, machine.h, machine.device
        sizes = torch.tensor([len(h.machines[name].states) for name in machine.names])
        self.offsets = (torch.cumsum(sizes, 0) - sizes).to(device)  # option of (machine k, state u): offsets[k] + u
        self.count = int(sizes.sum())
        self.names = [f"{name}.{state}" for name in machine.names for state in h.machines[name].states]
        machine_of = torch.repeat_interleave(torch.arange(len(sizes)), sizes).to(device)
        self.machine_of = machine_of.tolist()  # the machine of each option
        state_of = torch.arange(self.count, device=device) - self.offsets[machine_of]
        self.machine_of_option, self.state_of_option = machine_of, state_of
        choice = torch.zeros(self.count, dtype=torch.bool, device=device)
        for name, state in h.choices:
            choice[self.index(name, state)] = True
        runs = ~(machine.accepting[machine_of, state_of] | machine.failing[machine_of, state_of] | choice)
        self.runnable = runs.nonzero().flatten()  # the options that act: neither accepting, failing nor a choice

    def index(self, machine: str, state: str) -> int:
        """The option of a machine's state."""
        return self.names.index(f"{machine}.{state}")

    def of(self, stack: dict) -> torch.Tensor:
        """The option of each stack: its innermost machine and that machine's state."""
        top_machine, top_state = self.machine.top(stack)
        return self.offsets[top_machine] + top_state

    def step_each(self, labels: torch.Tensor, terms: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Every option that can run, stepped on each row's labels (N×P) as the innermost machine of a call stack
        whose callers do not matter: R·N rows ordered by option then row, with `option`, `next` (the option
        after the step, the same where it ended), `own` (its machine's own reward) and `ended` (a machine
        returned, the root accepted or the hierarchy failed), as a real stack would step them."""
        R, n = len(self.runnable), labels.shape[0]
        return self.step_as(self.runnable.repeat_interleave(n), concat([labels] * R), concat([terms] * R))

    def step_as(self, option: torch.Tensor, labels: torch.Tensor, terms: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Each row's `option` stepped on its labels as the innermost machine of a call stack whose callers do
        not matter (`step_each`'s keys)."""
        n, D = len(option), self.machine.max_depth
        stack = self.machine.reset(n)
        for key in ("machine", "state"):  # level 0 stands for the callers; the option runs at level 1
            stack[key] = torch.cat([stack[key], stack[key][:, :1]], 1)
        stack["paid"] = torch.zeros(n, D + 1, device=stack["paid"].device)
        stack["machine"][:, 1] = self.machine_of_option[option]
        stack["state"][:, 1] = self.state_of_option[option]
        stack["depth"][:] = 1
        after = self.machine.step(stack, labels, terms)[0]
        top_machine, top_state = self.machine.top(after)
        # as `step` ends an option: a machine returned (here: some return, or the option's machine accepted at
        # level 1, the root's acceptance), or the hierarchy failed
        at_level_1 = (after["depth"] == 1) & self.machine.accepting[top_machine, top_state]
        ended = after["returned"] | (after["depth"] == 0) | at_level_1 | after["failed"]
        return {"option": option, "next": torch.where(ended, option, self.offsets[top_machine] + top_state),
                "own": after["own"], "ended": ended}


class Calls:
    """The calls of a hierarchy's choice states, numbered: per call, the option its callee starts in (`starts`);
    per option, which calls it may choose among (`mask`)."""

    def __init__(self, options: Options) -> None:
        h, device = options.machine.h, options.machine.device
        edges = [(name, state, e.call) for (name, state), calls in h.choices.items() for e in calls]
        self.count = len(edges)
        self.names = [f"{name}.{state} -> {callee}" for name, state, callee in edges]
        at = torch.tensor([options.index(n, s) for n, s, _ in edges], dtype=torch.long, device=device)
        self.starts = torch.tensor([options.index(c, h.machines[c].initial) for *_, c in edges], dtype=torch.long,
                                   device=device)
        self.mask = torch.zeros(options.count, self.count, dtype=torch.bool, device=device)
        self.mask[at, torch.arange(self.count, device=device)] = True
        self.is_choice = self.mask.any(-1)


class HierarchyEnv(VecEnvWrapper):
    def __init__(self, env: VecEnv, h: Hierarchy, reward_mode: str = "replace") -> None:
        self.machine = compile_for(env, CompiledHierarchy, h, reward_mode)
        super().__init__(env)
        self.reward_mode = reward_mode
        self.options = Options(self.machine)
        self.calls = Calls(self.options)
        self.num_options, self.option_names = self.options.count, self.options.names
        self.machine_columns = self.num_options  # the one-hot's width at the end of `state`
        self.observation_space = state_space_plus(env, self.num_options)
        self.stack = self.machine.reset(env.num_envs)
        self.chosen = torch.full((env.num_envs,), -1, dtype=torch.long, device=env.device)  # per env: its call
        self.chooser: CallChooser | None = None
        self.call_learner: CallLearner | None = None
        self._pending: dict | None = None
        add_termination_hook(env, self._advance, "where the hierarchy accepts or fails")

    def use_chooser(self, chooser: CallChooser | None, learner: CallLearner | None = None) -> None:
        """The policy's chooser of calls (and, in the training env, its learner); None: calls at random."""
        self.chooser, self.call_learner = chooser, learner

    @property
    def learns_calls(self) -> bool:
        """Whether this env's choices are recorded and learned now (the training env, the policy training)."""
        return self.call_learner is not None and self.chooser.training

    def _advance(self, labels: torch.Tensor, terms: torch.Tensor | None) -> torch.Tensor:
        if self._pending is not None:
            raise SimError("the hierarchy must wrap the simulator inside action chunking (one simulator step per "
                           "machine step)")
        labels = labels.to(self.device)
        terms = terms.to(self.device) if terms is not None else None
        self._pending, self._reward = self.machine.step(self.stack, labels, terms)
        self._pursued = None
        if self.calls.count:  # rows waiting in a choice: the chosen call's option, stepped as if called
            waiting = self.chosen >= 0
            if waiting.any():
                rows = waiting.nonzero().flatten()
                chosen = self.options.step_as(self.calls.starts[self.chosen[rows]], labels[rows],
                                              terms[rows] if terms is not None else None)
                self._pursued = (rows, chosen)
        return self.machine.accepts(self._pending) | self._pending["failed"]

    def acting_option(self, stack: dict) -> torch.Tensor:
        """The option of each row: its innermost machine and state, or the chosen callee's where it waits in a
        choice."""
        option = self.options.of(stack)
        if self.calls.count:
            option = torch.where(self.chosen >= 0, self.calls.starts[self.chosen.clamp(min=0)], option)
        return option

    def with_option(self, obs: Obs, option: torch.Tensor) -> Obs:
        onehot = torch.nn.functional.one_hot(option, self.num_options).to(obs["state"].dtype)
        return {**obs, "state": torch.cat([obs["state"], onehot], -1), "rm_state": option}

    def choose(self, obs: Obs) -> None:
        """A call for every env whose stack rests in a choice state and has none."""
        option = self.options.of(self.stack)
        need = self.calls.is_choice[option] & (self.chosen < 0) & ~self.stack["failed"]
        if not need.any():
            return
        rows = need.nonzero().flatten()
        x = self.with_option({"state": obs["state"][rows]}, option[rows])["state"]
        mask = self.calls.mask[option[rows]]
        if self.chooser is None:
            call = torch.multinomial(mask.float(), 1).squeeze(-1)
        else:
            call = self.chooser.choose(x.to(next(self.chooser.parameters()).device), mask.to(x.device)).to(self.device)
            if self.learns_calls:
                self.call_learner.decide(rows, x, mask, call)
        self.chosen[rows] = call

    def reset(self, seed: int | None = None, options: dict | None = None) -> Obs:
        obs = self.env.reset(seed=seed, options=options)
        self.stack = self.machine.reset(self.num_envs)
        if self.calls.count:
            self.chosen[:] = -1
            if self.call_learner is not None:
                self.call_learner.drop_all()
            self.choose(obs)
        return self.with_option(obs, self.acting_option(self.stack))

    def step(self, action: torch.Tensor) -> tuple[Obs, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
        self._pending = None
        obs, env_reward, term, trunc, info = self.env.step(action)
        if self._pending is None:
            raise SimError("the hierarchy was not stepped: wrap the simulator directly (inside chunking)")
        stack = self._pending
        own = stack["own"].to(env_reward.dtype, copy=True)  # the stack keeps the real innermost machine's
        accepted = self.machine.accepts(stack)
        option_end = stack["returned"] | accepted | stack["failed"]
        if self._pursued is not None:  # the chosen option's own reward; it ends where another callee started
            rows, chosen = self._pursued
            own[rows] = chosen["own"].to(own.dtype)
            now = self.options.of(stack)[rows]
            moved_on = now != self.options.of(self.stack)[rows]
            option_end[rows] |= chosen["ended"] | (moved_on & (now != chosen["next"]))
            self.chosen[rows[moved_on]] = -1
        reward = own if self.reward_mode == "replace" else env_reward + own
        info["env_reward"], info["rm_reward"] = env_reward, own
        info["rm_state"], info["rm_accepted"] = stack["state"][:, 0], accepted  # the root's state: how far it got
        info["option_end"] = option_end
        done = term | trunc
        if "final_obs" in info:
            info["final_obs"] = self.with_option(info["final_obs"], self.acting_option(stack))
        if self.learns_calls:
            self.call_learner.pay(self._reward - stack["own"], term, trunc)  # what call edges paid on return
        fresh = self.machine.reset(self.num_envs)
        self.stack = {k: torch.where(done.view(-1, *[1] * (v.dim() - 1)), fresh[k], v) for k, v in stack.items()}
        if self.calls.count:
            self.chosen[done] = -1
            self.choose(obs)
            if self.learns_calls:
                self.call_learner.update()
        return self.with_option(obs, self.acting_option(self.stack)), reward, term, trunc, info

    def counterfactuals(self, state: torch.Tensor, next_state: torch.Tensor, labels: torch.Tensor,
                        env_reward: torch.Tensor, env_terminated: torch.Tensor,
                        terms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One env transition (`state`, `next_state` without the one-hot; N rows) as seen from every option that
        can run (`Options.step_each`), each paid and ended as `step` pays and ends it. Returns (states,
        next_states, rewards, terminated), R·N rows ordered by option then env."""
        rep = lambda x: concat([x] * len(self.options.runnable))  # noqa: E731
        each = self.options.step_each(labels.to(self.device), terms.to(self.device) if terms is not None else None)
        own = each["own"].to(env_reward.dtype)
        reward = own if self.reward_mode == "replace" else rep(env_reward) + own
        onehot = lambda v: torch.nn.functional.one_hot(v, self.num_options).to(state.dtype)  # noqa: E731
        return (torch.cat([rep(state), onehot(each["option"])], -1), torch.cat([rep(next_state), onehot(each["next"])], -1),
                reward, rep(env_terminated) | each["ended"])
