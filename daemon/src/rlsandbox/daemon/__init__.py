"""rlsandbox node daemon: warm pools of Docker sandboxes behind one gRPC API."""

__version__ = "0.1.0"
