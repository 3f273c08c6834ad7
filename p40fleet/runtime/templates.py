"""pyinfra's own template loader, so a template is rendered byte for byte as ``files.template``
renders it.

Adapts nothing in pyinfra's behaviour; it reaches past ``pyinfra.api``'s exports:
``get_template`` lives in ``pyinfra.api.util``. The unchanged-guards
(``operations/util/unchanged.py`` ``rendered``) compare a host's file with the template as
pyinfra would upload it, so they must render it with pyinfra's Jinja environment (its
``undefined``, ``keep_trailing_newline``), not one of their own.

Checked against pyinfra 3.10.0 (``api/util.py`` ``get_template(filename_or_io,
jinja_env_kwargs=None)``, called by ``operations/files.py`` ``template``).
"""

from __future__ import annotations

from pyinfra.api.util import get_template

__all__ = ["get_template"]
