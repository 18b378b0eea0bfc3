"""The harness ``rlsandbox-verifiers`` of verifiers >= 0.4, by the id its configs name it with.

verifiers imports a harness id as a top-level module (``harness = {id = "rlsandbox-verifiers"}``
imports ``rlsandbox_verifiers``) and takes the one ``Harness`` subclass it exports: this module is
that name for :class:`rlsandbox.integrations.verifiers_v1.RlsandboxHarness`.
"""

from rlsandbox.integrations.verifiers_v1 import RlsandboxHarness

__all__ = ["RlsandboxHarness"]
