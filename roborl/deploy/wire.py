"""Messages on the wire of the policy server and the twin: the msgpack-numpy codec of sim/libero_wire.py
(openpi's convention; decoding rejects anything but plain numeric arrays with a one-line `WireError`).
It lives there because LIBERO's server loads that file on its own, outside roborl."""
from roborl.sim.libero_wire import WireError, pack, unpack

__all__ = ["WireError", "pack", "unpack"]
