"""Checks answers of the running service against its own OpenAPI document."""

import re

from jsonschema import Draft202012Validator


class Contract:
    def __init__(self, document):
        self.document = document
        self.operations = {}
        for template, methods in document["paths"].items():
            pattern = re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", template) + "$")
            for method, operation in methods.items():
                self.operations[(method.upper(), template)] = (pattern, operation)
        self.answered = {}

    def operation(self, method, path):
        path = path.split("?", 1)[0]
        matches = [(template, operation) for (verb, template), (pattern, operation) in self.operations.items()
                   if verb == method and pattern.match(path)]
        # A literal segment beats a parameter (`/v1/users` against `/v1/users/{user}`).
        matches.sort(key=lambda match: match[0].count("{"))
        assert matches, f"{method} {path} is not in the document"
        return matches[0]

    def check(self, method, path, response):
        """Asserts that `response` is documented for the operation and matches its
        schema; records which operations answered which statuses."""
        template, operation = self.operation(method, path)
        status = str(response.status)
        documented = operation["responses"].get(status)
        assert documented, f"{method} {template} answered {status}, which the document does not list: {response.body[:300]}"
        self.answered.setdefault(operation["operationId"], set()).add(response.status)
        content = documented.get("content", {})
        content_type = (response.headers.get("content-type") or response.headers.get("Content-Type") or "").split(";")[0]
        assert content_type in content, f"{method} {template} {status}: content type {content_type!r}, documented {list(content)}"
        schema = content[content_type].get("schema")
        if content_type == "application/json" and schema is not None:
            root = dict(schema) if isinstance(schema, dict) else {"allOf": [schema]}
            root["components"] = self.document["components"]
            errors = sorted(Draft202012Validator(root).iter_errors(response.json()), key=lambda error: error.path)
            assert not errors, f"{method} {template} {status}: " + "; ".join(
                f"{'/'.join(map(str, error.path))}: {error.message[:200]}" for error in errors[:5])
        return response
