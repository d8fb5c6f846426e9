"""A non-trivial JSON schema for the grammar tests (nested objects, enums, arrays with bounds,
patterns, integer ranges) and its check by hand (the unit tests' environment has no jsonschema)."""

import re

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "role": {"enum": ["admin", "user"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,3}$"}, "minItems": 1,
                 "maxItems": 2},
        "home": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{3}$"}},
                 "required": ["zip"], "additionalProperties": False},
    },
    "required": ["name", "age", "role", "tags", "home"],
    "additionalProperties": False,
}


def valid(doc) -> bool:
    """SCHEMA's constraints checked by hand (the unit tests' environment has no jsonschema)."""
    return (isinstance(doc, dict) and set(doc) == set(SCHEMA["required"])
            and re.fullmatch("[a-z]{1,6}", doc["name"]) is not None
            and isinstance(doc["age"], int) and 0 <= doc["age"] <= 99 and doc["role"] in ("admin", "user")
            and 1 <= len(doc["tags"]) <= 2 and all(re.fullmatch("[a-z]{1,3}", t) for t in doc["tags"])
            and set(doc["home"]) == {"zip"} and re.fullmatch("[0-9]{3}", doc["home"]["zip"]) is not None)
