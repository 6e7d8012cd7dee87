"""The robot side of a deployment: the `RobotInterface` a robot driver implements, the fixed-rate
control loop with its watchdog, e-stop and shield, and a MuJoCo digital twin to test them against."""
from roborl.robot.control_loop import ControlLoop, LoopReport
from roborl.robot.ensemble import TemporalEnsembler
from roborl.robot.interface import RobotInterface

__all__ = ["ControlLoop", "LoopReport", "RobotInterface", "TemporalEnsembler"]
