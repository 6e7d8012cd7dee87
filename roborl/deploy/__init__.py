"""Deployment: export a trained policy to a self-contained artifact, serve it over a websocket, and
talk to it from the robot side (see `roborl.robot`)."""
