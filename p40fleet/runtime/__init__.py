"""Every adaptation of pyinfra, paramiko or inspect, and nothing else.

One module per adaptation; each says what it adapts, why, and the versions it was checked
against (pyinfra 3.10.0, paramiko 4.0.0, CPython 3.11). Each is installed explicitly, never on
import, and through pyinfra's public hooks where one exists:

- :mod:`~p40fleet.runtime.sshguard`: ``SSHConnector``'s connect, command and file methods
  wrapped in place (host-key refusal, paramiko's ``EOFError`` made per-host). No hook exists.
- :mod:`~p40fleet.runtime.ssh_poll`: the paramiko transport's idle wake-up, set on every
  connect by a ``BaseStateCallback.host_connect`` (so it holds after ``server.reboot``).
- :mod:`~p40fleet.runtime.host_gate`: a host failed before its first operation of the run
  (the run lock taken), by a ``BaseStateCallback``'s ``operation_start`` (``--serial``:
  ``operation_host_start``), leaning on when pyinfra picks each operation's hosts.
- :mod:`~p40fleet.runtime.deploy_frames`: ``sys.modules`` entries for the exec'd deploy files,
  so ``inspect.getmodule`` answers pyinfra's stack walk from its cache.
- :mod:`~p40fleet.runtime.included`: a layer's steps run under the operation-name prefix
  ``local.include`` gave its file (``Host.deploy``), so the names stay as they were.
- :mod:`~p40fleet.runtime.inventory`: the inventory read as pyinfra's CLI reads it
  (``pyinfra_cli.inventory``), in one place for the three CLIs that need it.
- :mod:`~p40fleet.runtime.connector_args`: a host's connector arguments (pyinfra's
  ``CONNECTOR_ARGUMENT_KEYS``, and ``pop_global_arguments`` outside an operation).
- :mod:`~p40fleet.runtime.templates`: pyinfra's own template loader (``pyinfra.api.util``),
  so a guard renders a template byte for byte as ``files.template`` does.

``tests/test_runtime_adaptations.py`` lists them and fails on one anywhere else.
"""
