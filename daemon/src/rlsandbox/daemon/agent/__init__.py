"""The in-sandbox agent (``sandbox_agent.py``, stdlib only) and the daemon's side of its protocol."""

import hashlib
import os
import tempfile
from pathlib import Path

AGENT_PATH = Path(__file__).with_name("sandbox_agent.py")
"""Host path of the agent file, bind-mounted read-only into every agent-driven sandbox."""


def stage_agent(folder: Path) -> Path:
    """A copy of the agent in ``folder``, named by its digest, for an engine that does not see the
    daemon's own files (the daemon in a container; ``agent_host_dir``). Written whole or not at
    all (a temporary file renamed), never rewritten: sandboxes of an earlier daemon version keep
    the file they were started with."""
    data = AGENT_PATH.read_bytes()
    target = folder / f"sandbox_agent-{hashlib.sha256(data).hexdigest()[:16]}.py"
    if target.is_file() and target.read_bytes() == data:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".agent-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
