"""Adapters that make rlsandbox a drop-in sandbox backend of the trainers people use. Each module
implements one framework's own environment interface with its own names and types, and imports
that framework: install it with the extra of the same name (``pip install
'rlsandbox-client[gymnasium]'``). The client core never imports anything from here.

- :mod:`rlsandbox.integrations.gymnasium`: a Gymnasium ``Env`` (docs/INTEGRATIONS.md).
- :mod:`rlsandbox.integrations.minisweagent`: a mini-swe-agent ``Environment``.
- :mod:`rlsandbox.integrations.skyrl`: a SkyRL-gym ``BaseTextEnv``.
- :mod:`rlsandbox.integrations.verl`: a verl ``BaseTool`` whose session lives across a trajectory, and
  the agent loop ``rlsandbox_tool_agent`` that grades it.
- :mod:`rlsandbox.integrations.slime`: slime's async ``Sandbox`` (no framework import: slime is
  not on PyPI).
- :mod:`rlsandbox.integrations.rllm`: rLLM's ``Sandbox`` and per-task hooks (rLLM is not on PyPI either).
- :mod:`rlsandbox.integrations.harbor`: a harbor ``BaseEnvironment``, by import path (harbor's
  base class when harbor is importable, Python >= 3.12).
- :mod:`rlsandbox.integrations.transfer`: uploads and downloads as tars through a command.
- :mod:`rlsandbox.integrations.tools`: the bash/view/edit/write/submit tool calls they share.
"""
