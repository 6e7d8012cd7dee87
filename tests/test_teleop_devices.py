"""Teleop devices without the hardware: the gamepad and keyboard mappings fed with evdev's own InputEvents,
the SpaceMouse's with pyspacemouse's own state (and one HID report through its decoder), `make_teleop`'s
errors, and the one-line errors of opening a device that is not there. The reading threads need a real
device (or /dev/uinput), which this suite's machines do not have."""
import subprocess
import sys

import evdev
import numpy as np
import pyspacemouse
import pytest
from evdev import ecodes

from roborl.errors import UserError
from roborl.robot import teleop_devices as td
from roborl.robot.teleop_devices import (
    GamepadMapping,
    GamepadOperator,
    KeyboardMapping,
    KeyboardOperator,
    make_teleop,
    spacemouse_action,
)

OPEN, CLOSED = 1.0, -1.0


def event(type_: int, code: int, value: int) -> evdev.InputEvent:
    return evdev.InputEvent(0, 0, type_, code, value)


def stick(code: int, value: int) -> evdev.InputEvent:
    return event(ecodes.EV_ABS, code, value)


def key(code: int, value: int) -> evdev.InputEvent:
    return event(ecodes.EV_KEY, code, value)


def fed(mapping, *events):
    for e in events:
        mapping.feed(e)
    return mapping.action()


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def test_the_event_codes_are_evdevs():
    for name in ("EV_SYN", "EV_KEY", "EV_ABS", "SYN_REPORT", "SYN_DROPPED", "ABS_X", "ABS_Y", "ABS_RY", "BTN_SOUTH",
                 "BTN_TR", "KEY_W", "KEY_R", "KEY_A", "KEY_S", "KEY_D", "KEY_F", "KEY_SPACE"):
        assert getattr(td, name) == getattr(ecodes, name), name


# ---- gamepad ----------------------------------------------------------------------------------------------
def test_gamepad_at_rest_or_inside_the_deadzone_lets_the_policy_act():
    pad = GamepadMapping(speed=1.0, deadzone=0.15)
    assert pad.action() is None
    assert fed(pad, stick(ecodes.ABS_X, 3000), stick(ecodes.ABS_Y, -4000), stick(ecodes.ABS_RY, 4500)) is None
    assert fed(pad, stick(ecodes.ABS_X, 6000)) is not None  # 0.18 of the range: past the deadzone


@pytest.mark.parametrize("code, value, dim, sign", [
    (ecodes.ABS_Y, -32768, 0, 1.0),   # left stick forward: away from the base
    (ecodes.ABS_Y, 32767, 0, -1.0),
    (ecodes.ABS_X, -32768, 1, 1.0),   # left stick left: the base's +y
    (ecodes.ABS_X, 32767, 1, -1.0),
    (ecodes.ABS_RY, -32768, 2, 1.0),  # right stick forward: up
    (ecodes.ABS_RY, 32767, 2, -1.0),
])
def test_gamepad_full_deflection_moves_one_axis_with_its_sign(code, value, dim, sign):
    action = fed(GamepadMapping(speed=0.5), stick(code, value))
    expected = np.zeros(4, np.float32)
    expected[dim], expected[3] = 0.5 * sign, OPEN
    np.testing.assert_allclose(action, expected, atol=1e-4)


def test_gamepad_command_grows_from_zero_at_the_deadzone_and_is_clipped():
    pad = GamepadMapping(speed=1.0, deadzone=0.2)
    just_past = fed(pad, stick(ecodes.ABS_X, int(-0.21 * 32768)))
    assert 0 < just_past[1] < 0.02
    half = fed(pad, stick(ecodes.ABS_X, int(-0.6 * 32768)))
    assert half[1] == pytest.approx(0.5, abs=1e-3)
    fast = GamepadMapping(speed=3.0, deadzone=0.2)
    assert fed(fast, stick(ecodes.ABS_X, int(-0.6 * 32768)))[1] == 1.0  # 1.5 clipped
    assert np.abs(fed(fast, stick(ecodes.ABS_Y, 32767), stick(ecodes.ABS_RY, -32768))).max() <= 1.0


def test_gamepad_reads_the_devices_own_axis_range():
    info = evdev.AbsInfo(value=128, min=0, max=255, fuzz=0, flat=15, resolution=0)
    pad = GamepadMapping(speed=1.0, ranges={ecodes.ABS_X: (info.min, info.max)})
    assert fed(pad, stick(ecodes.ABS_X, info.value)) is None  # the centre of 0..255
    assert fed(pad, stick(ecodes.ABS_X, 0))[1] == pytest.approx(1.0)


def test_gamepad_holding_the_bumper_closes_the_gripper_and_is_an_intervention():
    pad = GamepadMapping(speed=1.0)
    np.testing.assert_array_equal(fed(pad, key(ecodes.BTN_TR, 1)), [0, 0, 0, CLOSED])
    np.testing.assert_allclose(fed(pad, stick(ecodes.ABS_Y, -32768)), [1, 0, 0, CLOSED], atol=1e-4)
    np.testing.assert_allclose(fed(pad, key(ecodes.BTN_TR, 0)), [1, 0, 0, OPEN], atol=1e-4)
    assert fed(pad, stick(ecodes.ABS_Y, 0), key(ecodes.BTN_SOUTH, 1)) is None  # other buttons: unmapped


# ---- keyboard ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code, dim, sign", [
    (ecodes.KEY_W, 0, 1.0), (ecodes.KEY_S, 0, -1.0), (ecodes.KEY_A, 1, 1.0), (ecodes.KEY_D, 1, -1.0),
    (ecodes.KEY_R, 2, 1.0), (ecodes.KEY_F, 2, -1.0),
])
def test_keyboard_key_moves_one_axis_while_held(code, dim, sign):
    keys = KeyboardMapping(speed=0.25)
    expected = np.zeros(4, np.float32)
    expected[dim], expected[3] = 0.25 * sign, OPEN
    np.testing.assert_array_equal(fed(keys, key(code, 1)), expected)
    np.testing.assert_array_equal(fed(keys, key(code, 2)), expected)  # key repeat: still held
    assert fed(keys, key(code, 0)) is None


def test_keyboard_combines_keys_clips_and_closes_with_space():
    keys = KeyboardMapping(speed=2.0)
    np.testing.assert_array_equal(fed(keys, key(ecodes.KEY_W, 1), key(ecodes.KEY_A, 1)), [1, 1, 0, OPEN])
    np.testing.assert_array_equal(fed(keys, key(ecodes.KEY_S, 1)), [0, 1, 0, OPEN])  # W and S cancel
    np.testing.assert_array_equal(fed(keys, key(ecodes.KEY_SPACE, 1)), [0, 1, 0, CLOSED])
    np.testing.assert_array_equal(fed(keys, *(key(c, 0) for c in (ecodes.KEY_W, ecodes.KEY_S, ecodes.KEY_A))),
                                  [0, 0, 0, CLOSED])
    assert fed(keys, key(ecodes.KEY_SPACE, 0), key(ecodes.KEY_Q, 1)) is None  # unmapped keys: no intervention


# ---- SpaceMouse -------------------------------------------------------------------------------------------
def state(**axes) -> pyspacemouse.SpaceMouseState:
    buttons = axes.pop("buttons", [0, 0])
    return pyspacemouse.SpaceMouseState(buttons=pyspacemouse.ButtonState(buttons), **axes)


def test_spacemouse_at_rest_or_drifting_lets_the_policy_act():
    assert spacemouse_action(state()) is None
    assert spacemouse_action(state(x=0.05, y=-0.08, z=0.09), deadzone=0.1) is None
    assert spacemouse_action(state(roll=0.9, pitch=-0.9, yaw=0.9)) is None  # rotations command nothing


@pytest.mark.parametrize("axes, dim, sign", [
    ({"y": 1.0}, 0, 1.0), ({"y": -1.0}, 0, -1.0),  # cap pushed away from the user: away from the base
    ({"x": -1.0}, 1, 1.0), ({"x": 1.0}, 1, -1.0),  # to the left: the base's +y
    ({"z": 1.0}, 2, 1.0), ({"z": -1.0}, 2, -1.0),  # pulled up: up
])
def test_spacemouse_translation_moves_one_axis_with_its_sign(axes, dim, sign):
    expected = np.zeros(4, np.float32)
    expected[dim], expected[3] = 0.5 * sign, OPEN
    np.testing.assert_allclose(spacemouse_action(state(**axes), speed=0.5), expected, atol=1e-6)


def test_spacemouse_is_clipped_and_its_button_closes_the_gripper():
    np.testing.assert_allclose(spacemouse_action(state(y=1.6, x=-2.0), speed=1.0), [1, 1, 0, OPEN])
    np.testing.assert_allclose(spacemouse_action(state(y=0.55), speed=4.0, deadzone=0.1), [1, 0, 0, OPEN])
    np.testing.assert_array_equal(spacemouse_action(state(buttons=[1, 0])), [0, 0, 0, CLOSED])
    assert spacemouse_action(state(buttons=[0, 1])) is None
    np.testing.assert_array_equal(spacemouse_action(state(buttons=[0, 1]), grip_button=1), [0, 0, 0, CLOSED])
    assert spacemouse_action(state(buttons=[]), grip_button=3) is None  # a model without that button


def test_pyspacemouse_reports_pushing_the_cap_away_as_plus_y_in_the_convention_we_open():
    """One HID report (channel 1: x, y, z as int16) through pyspacemouse's own decoder, with the convention
    SpaceMouseOperator opens the device in: HID's y points toward the user, so pushing away is negative."""
    spec = pyspacemouse.apply_axis_convention(pyspacemouse.get_device_specs()["SpaceMouseWireless"],
                                              pyspacemouse.AxisConvention.HID_Z_UP)
    mouse = pyspacemouse.SpaceMouseDevice(info=spec)
    report = bytes([1]) + np.array([0, -350, -350, 0, 0, 0], "<i2").tobytes()  # pushed away, pulled up
    mouse._process(report)
    np.testing.assert_allclose(spacemouse_action(mouse._state, speed=1.0, deadzone=0.0), [1, 0, 1, OPEN])


# ---- the factory and the errors ---------------------------------------------------------------------------
def test_make_teleop_none_and_its_errors():
    assert make_teleop("none") is None
    with pytest.raises(UserError) as excinfo:
        make_teleop("scripted")
    assert all(kind in one_line_error(excinfo) for kind in ("none", "keyboard", "gamepad", "spacemouse"))
    with pytest.raises(UserError, match="speeed") as excinfo:
        make_teleop("gamepad", speeed=1.0)
    assert "deadzone" in one_line_error(excinfo)  # it lists the options the device takes
    with pytest.raises(UserError, match="no options"):
        make_teleop("none", speed=1.0)


@pytest.mark.parametrize("kind, cls", [("gamepad", GamepadOperator), ("keyboard", KeyboardOperator)])
def test_opening_an_absent_evdev_device_says_so_in_one_line(kind, cls, tmp_path):
    (tmp_path / "event0").write_text("")  # not a character device: not an input device
    (tmp_path / "event1").symlink_to("/dev/null")  # a character device, but no input device: skipped
    with pytest.raises(UserError, match=f"no {kind} found under {tmp_path} .*'input' group") as excinfo:
        make_teleop(kind, input_dir=str(tmp_path))
    one_line_error(excinfo)
    with pytest.raises(UserError, match="no input device at .*event7"):
        cls(path=str(tmp_path / "event7"))
    with pytest.raises(UserError, match="event0 is not an input device"):
        cls(path=str(tmp_path / "event0"))


def test_opening_a_spacemouse_where_there_is_none_says_so_in_one_line():
    """This machine has no SpaceMouse: the error says that, or that HIDAPI is missing where it is."""
    with pytest.raises(UserError, match=r"^(no SpaceMouse found|the SpaceMouse needs the HIDAPI library)") as excinfo:
        make_teleop("spacemouse")
    one_line_error(excinfo)


@pytest.mark.parametrize("kind, library", [("gamepad", "evdev"), ("keyboard", "evdev"), ("spacemouse", "pyspacemouse")])
def test_a_missing_library_says_how_to_install_it(kind, library, monkeypatch):
    monkeypatch.setitem(sys.modules, library, None)  # what `import` sees when the package is not installed
    with pytest.raises(UserError, match=rf"needs {library} .*pip install 'roborl\[teleop\]'") as excinfo:
        make_teleop(kind)
    one_line_error(excinfo)


def test_the_module_imports_without_the_device_libraries():
    code = ("import sys; sys.modules['evdev'] = sys.modules['pyspacemouse'] = None; "
            "import roborl.robot.teleop_devices as td; print(td.make_teleop('none'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "None", result.stderr
