"""Helpers of the operations that are not operations: unchanged-guards, as-user commands,
progress, the dpkg-lock wait of apt commands, the reboot wait (as pyinfra keeps its own in
``pyinfra/operations/util/``). Importing changes nothing; no module here imports an operations
module."""
