"""The jinja2 environment for ``codegen/templates/*.j2``.

Templates place pre-formatted blocks; ``StrictUndefined`` turns a missing variable into
an error instead of silently generating an empty string.
"""

from __future__ import annotations

from typing import Any

import jinja2

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("codegen", "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
)


def render(template: str, **context: Any) -> str:
    text = _ENV.get_template(template).render(**context)
    return "\n".join(line.rstrip() for line in text.split("\n"))
