"""Teleop devices for human interventions (HIL-SERL): a gamepad or a keyboard read through Linux evdev, a
3Dconnexion SpaceMouse through pyspacemouse. `make_teleop(kind, **options)` builds one for the control loop.

Every device commands the embedded tasks' `ee_delta_pos` controller (roborl/tasks/arm.py, and
`FrankaRobot`'s): the action is [dx, dy, dz, gripper] in [-1, 1], the TCP moving by dx·`max_ee_step` along
the robot base's x (away from the base), y (to the base's left) and z (up); gripper +1 is open, -1 closed
(each finger opens by (gripper + 1) / 2 of its travel). The mapping assumes an operator behind the robot,
facing the base's +x: pushing the stick or the SpaceMouse cap forward moves the TCP away from them.

Intervention: a device answers None (the policy acts) while nothing is pressed and its sticks or cap rest
inside the deadzone, and an action as soon as the operator moves it or holds the gripper button, so
moving the device is taking over. The gripper closes while its button is held and opens when it is
released: nothing latched in the device can disagree with the robot after the policy ran, and holding
the button alone (no motion) is an intervention that grasps in place. Without the button held, an
intervention commands the gripper open, so keep it held while carrying. `speed` is the fraction of the
action range a full deflection (or a key) commands.

Each device is read in a daemon thread, so no event waits in the kernel's small buffers for the next
poll (a lost release would keep the robot moving); if the device fails (unplugged), `poll` raises and the
control loop stops the robot. The mapping from input to action is a pure state object per device
(`GamepadMapping`, `KeyboardMapping`, `spacemouse_action`), fed with the libraries' own event and state
objects, which is how the tests check it without hardware.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib
import inspect
import os
import select
import stat
import threading
import time
from abc import abstractmethod
from typing import Any

import numpy as np

from roborl.errors import UserError
from roborl.robot.teleop import TeleopDevice

GRIPPER_OPEN, GRIPPER_CLOSED = 1.0, -1.0
INSTALL = "pip install 'roborl[teleop]'"
INPUT_GROUP = "add the user to the 'input' group: sudo usermod -aG input $USER, then log in again"

# Linux input event codes (linux/input-event-codes.h, a stable kernel ABI; evdev.ecodes has the same numbers),
# so that the mappings are importable without evdev
EV_SYN, EV_KEY, EV_ABS = 0x00, 0x01, 0x03
SYN_REPORT, SYN_DROPPED = 0, 3
ABS_X, ABS_Y, ABS_RY = 0x00, 0x01, 0x04
BTN_SOUTH, BTN_TR = 0x130, 0x137
KEY_W, KEY_R, KEY_A, KEY_S, KEY_D, KEY_F, KEY_SPACE = 17, 19, 30, 31, 32, 33, 57


def _action(motion: np.ndarray, grip: bool, speed: float) -> np.ndarray:
    return np.r_[np.clip(speed * motion, -1, 1), GRIPPER_CLOSED if grip else GRIPPER_OPEN].astype(np.float32)


def _deflection(motion: np.ndarray, grip: bool, deadzone: float, speed: float) -> np.ndarray | None:
    """The action of an analog device at `motion` in [-1, 1] per axis (dx, dy, dz), or None when it rests and
    the gripper button is up. Inside the deadzone an axis reads 0; outside it is rescaled so that the
    command grows from 0 at the deadzone's edge instead of jumping."""
    motion = np.clip(np.asarray(motion, np.float64), -1, 1)
    magnitude = np.abs(motion)
    moved = np.where(magnitude > deadzone, np.sign(motion) * (magnitude - deadzone) / (1 - deadzone), 0.0)
    return _action(moved, grip, speed) if grip or moved.any() else None


class GamepadMapping:
    """A gamepad's state from its evdev events (Xbox layout as the xpad, hid-microsoft and hid-playstation
    drivers report it), and the action: left stick forward/back → ±dx, left stick left/right → ±dy,
    right stick forward/back → ±dz, right bumper (RB, BTN_TR) held → gripper closed."""

    AXES = ((ABS_Y, 0, -1.0), (ABS_X, 1, -1.0), (ABS_RY, 2, -1.0))  # (event code, action dim, sign)
    GRIP = BTN_TR
    ABS_CODES, KEY_CODES = tuple(code for code, _, _ in AXES), (BTN_TR,)

    def __init__(self, speed: float = 0.5, deadzone: float = 0.15,
                 ranges: dict[int, tuple[int, int]] | None = None) -> None:
        """`ranges`: each axis's raw (min, max) from the device's absinfo; default the xpad sticks'."""
        self.speed, self.deadzone = speed, deadzone
        self.ranges = {code: (-32768, 32767) for code in self.ABS_CODES} | (ranges or {})
        self.sticks = np.zeros(3)
        self.grip = False

    def feed(self, event: Any) -> None:
        """Update the state with one `evdev.InputEvent`."""
        if event.type == EV_ABS:
            for code, dim, sign in self.AXES:
                if event.code == code:
                    low, high = self.ranges[code]
                    self.sticks[dim] = sign * (2 * (event.value - low) / (high - low) - 1)
        elif event.type == EV_KEY and event.code == self.GRIP:
            self.grip = event.value != 0

    def action(self) -> np.ndarray | None:
        return _deflection(self.sticks, self.grip, self.deadzone, self.speed)


class KeyboardMapping:
    """A keyboard's held keys from its evdev events, and the action: W/S → ±dx, A/D → ±dy, R/F → ±dz (each
    key commands `speed`), space held → gripper closed. Key repeats (value 2) count as held."""

    KEYS = {KEY_W: (0, 1.0), KEY_S: (0, -1.0), KEY_A: (1, 1.0), KEY_D: (1, -1.0), KEY_R: (2, 1.0), KEY_F: (2, -1.0)}
    GRIP = KEY_SPACE
    ABS_CODES, KEY_CODES = (), (*KEYS, KEY_SPACE)

    def __init__(self, speed: float = 0.5) -> None:
        self.speed = speed
        self.held: set[int] = set()

    def feed(self, event: Any) -> None:
        """Update the state with one `evdev.InputEvent`."""
        if event.type == EV_KEY and event.code in self.KEY_CODES:
            (self.held.add if event.value else self.held.discard)(event.code)

    def action(self) -> np.ndarray | None:
        """None while no mapped key is held; opposite keys held together cancel (an intervention that stays)."""
        if not self.held:
            return None
        motion = np.zeros(3)
        for code in self.held & self.KEYS.keys():
            dim, sign = self.KEYS[code]
            motion[dim] += sign
        return _action(motion, self.GRIP in self.held, self.speed)


def spacemouse_action(state: Any, speed: float = 0.5, deadzone: float = 0.1, grip_button: int = 0) -> np.ndarray | None:
    """The action for a `pyspacemouse.SpaceMouseState` read in the HID_Z_UP convention (x right, y away from
    the user, z up): cap pushed away → +dx, to the left → +dy, pulled up → +dz; button `grip_button` held →
    gripper closed (an index into the model's buttons in pyspacemouse's devices.toml: 0 is LEFT on the
    two-button models, MENU on the Pro ones). Rotations of the cap command nothing."""
    grip = grip_button < len(state.buttons) and bool(state.buttons[grip_button])
    return _deflection(np.array([state.y, -state.x, state.z]), grip, deadzone, speed)


def _import(module: str, device: str) -> Any:
    try:
        return importlib.import_module(module)
    except (ImportError, OSError) as exc:
        raise UserError(f"the {device} needs {module} ({exc}): {INSTALL}") from exc


class _BackgroundDevice(TeleopDevice):
    """A device whose input a daemon thread reads into a mapping, which `poll` turns into the action."""

    name = "device"

    def __init__(self) -> None:
        self._lock, self._stopping = threading.Lock(), threading.Event()
        self._failure: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"teleop-{self.name}", daemon=True)

    def _start(self) -> None:
        """Start reading, once the device is open."""
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._read()
        except Exception as exc:  # the device went away: poll reports it, and the control loop stops the robot
            self._failure = exc

    @abstractmethod
    def _read(self) -> None:
        """Wait briefly (at most ~0.1 s) for input and fold what came into the state, under `self._lock`."""

    @abstractmethod
    def _action(self) -> np.ndarray | None:
        """The action for the current state (called under `self._lock`)."""

    def poll(self, obs: dict[str, np.ndarray]) -> np.ndarray | None:
        if self._failure is not None:
            raise UserError(f"the {self.name} stopped answering ({self._failure}); is it still plugged in?")
        with self._lock:
            return self._action()

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=1.0)
        self._close_device()

    @abstractmethod
    def _close_device(self) -> None: ...

    def __enter__(self) -> _BackgroundDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _EvdevOperator(_BackgroundDevice):
    """An evdev input device (found under `input_dir` by its capabilities, or the one at `path`)."""

    def __init__(self, mapping: GamepadMapping | KeyboardMapping, path: str | None, input_dir: str) -> None:
        super().__init__()
        self.evdev = _import("evdev", self.name)
        self.device = self._open(path, input_dir)
        if isinstance(mapping, GamepadMapping):
            mapping.ranges |= {code: (info.min, info.max) for code, info in self._abs_infos().items() if info.max > info.min}
        self.mapping = mapping
        self._dropped = False
        self._sync()
        self._start()

    @abstractmethod
    def _matches(self, caps: dict[int, list[int]]) -> bool:
        """Whether a device with these capabilities (event type → codes) is this kind of device."""

    def _open(self, path: str | None, input_dir: str) -> Any:
        evdev = self.evdev
        if path is not None:
            try:
                device = evdev.InputDevice(path, readonly=True)
            except FileNotFoundError as exc:
                raise UserError(f"no input device at {path} (list them with: python -m evdev.evtest)") from exc
            except PermissionError as exc:
                raise UserError(f"cannot read {path}: {INPUT_GROUP}") from exc
            except OSError as exc:
                raise UserError(f"{path} is not an input device ({exc.strerror})") from exc
            if not self._matches(device.capabilities(absinfo=False)):
                device.close()
                raise UserError(f"{path} ({device.name}) is not a {self.name}")
            return device
        present = [p for p in sorted(glob.glob(os.path.join(input_dir, "event*"))) if stat.S_ISCHR(os.stat(p).st_mode)]
        readable = [p for p in present if os.access(p, os.R_OK)]
        if present and not readable:
            raise UserError(f"cannot read the input devices under {input_dir}: {INPUT_GROUP}")
        for candidate in readable:
            try:
                device = evdev.InputDevice(candidate, readonly=True)
            except OSError:
                continue
            if self._matches(device.capabilities(absinfo=False)):
                return device
            device.close()
        raise UserError(f"no {self.name} found under {input_dir} (is it plugged in, and is the user in the 'input' group?)")

    def _abs_infos(self) -> dict[int, Any]:
        """The device's axes and their current absinfo (value, range), read from the device now."""
        return {code: self.device.absinfo(code) for code in self.device.capabilities(absinfo=False).get(EV_ABS, [])}

    def _sync(self) -> None:
        """Set the state from the device's current one (at start, and after the kernel dropped events)."""
        evdev, active, infos = self.evdev, set(self.device.active_keys()), self._abs_infos()
        events = [evdev.InputEvent(0, 0, EV_ABS, code, infos[code].value) for code in self.mapping.ABS_CODES if code in infos]
        events += [evdev.InputEvent(0, 0, EV_KEY, code, int(code in active)) for code in self.mapping.KEY_CODES]
        with self._lock:
            for event in events:
                self.mapping.feed(event)

    def _read(self) -> None:
        if not select.select([self.device.fd], [], [], 0.1)[0]:
            return
        try:
            events = list(self.device.read())
        except BlockingIOError:
            return
        for event in events:
            if event.type == EV_SYN and event.code == SYN_DROPPED:
                self._dropped = True  # the kernel's buffer overflowed: skip to the next report, then re-read
            elif event.type == EV_SYN and event.code == SYN_REPORT and self._dropped:
                self._dropped = False
                self._sync()
            elif not self._dropped:
                with self._lock:
                    self.mapping.feed(event)

    def _action(self) -> np.ndarray | None:
        return self.mapping.action()

    def _close_device(self) -> None:
        self.device.close()


class GamepadOperator(_EvdevOperator):
    """A gamepad (Xbox, PlayStation or alike) as the operator's device; the axes in `GamepadMapping`."""

    name = "gamepad"

    def __init__(self, speed: float = 0.5, deadzone: float = 0.15, path: str | None = None,
                 input_dir: str = "/dev/input") -> None:
        """`path`: the gamepad's /dev/input/event* (default: the first device with sticks and gamepad buttons)."""
        super().__init__(GamepadMapping(speed, deadzone), path, input_dir)

    def _matches(self, caps: dict[int, list[int]]) -> bool:
        return BTN_SOUTH in caps.get(EV_KEY, []) and {ABS_X, ABS_Y} <= set(caps.get(EV_ABS, []))


class KeyboardOperator(_EvdevOperator):
    """A keyboard as the operator's device; the keys in `KeyboardMapping`. The device is not grabbed: the keys
    also reach the focused window (a terminal keeps answering Ctrl-C)."""

    name = "keyboard"

    def __init__(self, speed: float = 0.5, path: str | None = None, input_dir: str = "/dev/input") -> None:
        """`path`: the keyboard's /dev/input/event* (default: the first device with the mapped keys)."""
        super().__init__(KeyboardMapping(speed), path, input_dir)

    def _matches(self, caps: dict[int, list[int]]) -> bool:
        return set(KeyboardMapping.KEY_CODES) <= set(caps.get(EV_KEY, []))


class SpaceMouseOperator(_BackgroundDevice):
    """A 3Dconnexion SpaceMouse as the operator's device (HIL-SERL's): translations as in `spacemouse_action`.
    Reading it needs the HIDAPI library (libhidapi-hidraw0) and read access to its /dev/hidraw* node."""

    name = "SpaceMouse"

    def __init__(self, speed: float = 0.5, deadzone: float = 0.1, grip_button: int = 0) -> None:
        super().__init__()
        self.pyspacemouse = pyspacemouse = _import("pyspacemouse", self.name)
        self.speed, self.deadzone, self.grip_button = speed, deadzone, grip_button
        try:
            connected = pyspacemouse.get_connected_devices()
        except RuntimeError as exc:  # pyspacemouse's words for a HIDAPI library it could not load
            raise UserError("the SpaceMouse needs the HIDAPI library: sudo apt-get install libhidapi-hidraw0") from exc
        if not connected:
            raise UserError("no SpaceMouse found (is it plugged in, and may the user read its /dev/hidraw* node? "
                            "see the udev rule in docs/guides/sim-to-real.md)")
        try:
            self.device = pyspacemouse.open(device=connected[0], axis_convention=pyspacemouse.AxisConvention.HID_Z_UP)
        except RuntimeError as exc:
            raise UserError(f"cannot open the {connected[0]} ({exc}): may the user read its /dev/hidraw* node? "
                            "see the udev rule in docs/guides/sim-to-real.md") from exc
        self.state = pyspacemouse.SpaceMouseState()
        self._start()

    def _read(self) -> None:
        state = self.device.read()  # processes one HID report if one came (non-blocking), and stamps it
        if state.t == self.state.t:
            time.sleep(0.002)
            return
        with self._lock:  # a copy: the device keeps updating its own state object
            self.state = dataclasses.replace(state, buttons=self.pyspacemouse.ButtonState(state.buttons))

    def _action(self) -> np.ndarray | None:
        return spacemouse_action(self.state, self.speed, self.deadzone, self.grip_button)

    def _close_device(self) -> None:
        self.device.close()


DEVICES: dict[str, type[TeleopDevice] | None] = {
    "none": None, "keyboard": KeyboardOperator, "gamepad": GamepadOperator, "spacemouse": SpaceMouseOperator}


def make_teleop(kind: str, **options: Any) -> TeleopDevice | None:
    """The operator's device of this kind (None for "none"), opened and being read; `options` go to its class
    (`speed`, and per device `deadzone`, `path`, `grip_button`)."""
    if kind not in DEVICES:
        raise UserError(f"unknown teleop device '{kind}'; available: {', '.join(DEVICES)}")
    cls = DEVICES[kind]
    if cls is None:
        if options:
            raise UserError(f"teleop 'none' takes no options (got {', '.join(options)})")
        return None
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        accepted = ", ".join(inspect.signature(cls).parameters)
        raise UserError(f"teleop '{kind}': {exc}; its options: {accepted}") from exc
    return cls(**options)
