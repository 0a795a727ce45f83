"""MkDocs hook (mkdocs.yml, `hooks:`): the docstrings' Sphinx roles (:func:`linrec`, :class:`EMA`) shown as the
code they name, since the Markdown that mkdocstrings renders them with has no roles."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj):(?=<code>)")


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub("", html)
