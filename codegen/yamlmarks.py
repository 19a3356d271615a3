"""YAML loading that remembers where every mapping, key and list item came from.

Theory of operation
-------------------
``load_marked(text, path)`` parses with a ``yaml.SafeLoader`` subclass whose mapping and
sequence constructors build ``MarkedDict`` / ``MarkedList``: plain dict/list subclasses
that also carry the 1-based line of the node and of each key or item. Scalars stay plain
Python values. Two schema rules are enforced here because only the parser sees them:
a key spelled ``on`` (or any other YAML 1.1 boolean spelling), which YAML reads as
``True``, and a key repeated within one mapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from codegen.errors import TableError


class MarkedDict(dict[Any, Any]):
    """A mapping with the line of the mapping itself and of each key."""

    line: int
    key_lines: dict[Any, int]


class MarkedList(list[Any]):
    """A sequence with the line of the sequence itself and of each item."""

    line: int
    item_lines: list[int]


def line_of(node: Node) -> int:
    return int(node.start_mark.line) + 1


def load_marked(text: str, path: Path | str) -> Any:
    """Parse ``text``; every mapping/sequence in the result carries line numbers."""

    class _Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader: yaml.SafeLoader, node: MappingNode) -> MarkedDict:
        loader.flatten_mapping(node)
        result = MarkedDict()
        result.line = line_of(node)
        result.key_lines = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if isinstance(key, bool):
                spelled = key_node.value if isinstance(key_node, ScalarNode) else str(key)
                hint = (" (a row uses `event:`; quote a name that must be On)"
                        if spelled.lower() == "on" else " (quote it)")
                raise TableError(path, line_of(key_node), "on-key",
                                 f"key `{spelled}:` is read by YAML 1.1 as {key}{hint}")
            try:
                hash(key)
            except TypeError:
                raise TableError(path, line_of(key_node), "schema",
                                 "a mapping key must be a name") from None
            if key in result:
                raise TableError(path, line_of(key_node), "schema", f"duplicate key {key!r}")
            result[key] = loader.construct_object(value_node, deep=True)
            result.key_lines[key] = line_of(key_node)
        return result

    def construct_sequence(loader: yaml.SafeLoader, node: SequenceNode) -> MarkedList:
        result = MarkedList(loader.construct_object(item, deep=True) for item in node.value)
        result.line = line_of(node)
        result.item_lines = [line_of(item) for item in node.value]
        return result

    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    _Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, construct_sequence)
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = int(mark.line) + 1 if mark is not None else 1
        raise TableError(path, line, "yaml", str(exc.problem or exc)) from None
    except yaml.YAMLError as exc:
        raise TableError(path, 1, "yaml", str(exc)) from None
