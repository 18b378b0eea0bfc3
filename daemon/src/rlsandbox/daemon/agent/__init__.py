"""The in-sandbox agent (``sandbox_agent.py``, stdlib only) and the daemon's side of its protocol."""

from pathlib import Path

AGENT_PATH = Path(__file__).with_name("sandbox_agent.py")
"""Host path of the agent file, bind-mounted read-only into every agent-driven sandbox."""
