"""Results and call inputs as plain data on the sandbox's pipes: ``_child_encode`` (in the sandbox, of
a call's result; in the trainer, of an input it computed) and ``_child_decode`` (in the sandbox, of those
inputs). Shipped as source into the sandboxed process like ``sandbox_child``: stdlib only, imports inside.
The trainer decodes results with its own bounded ``sandbox_results.decode_value``."""


def _child_encode(value, iterate: bool) -> tuple:
    """``(True, json_ready)`` for plain data (see ``sandbox_verdict``), ``(False, "unplain:<type>")``
    otherwise. Subclasses of the plain types are sent as their base type."""
    import math

    budget = [1_000_000]
    plain = (bool, int, float, complex, str, bytes, bytearray, list, tuple, dict, set, frozenset)

    def enc(x, depth):
        budget[0] -= 1
        if depth > 100 or budget[0] < 0:
            raise ValueError("result too deep or too large")
        if x is None or x is True or x is False:
            return x
        if isinstance(x, int):
            x = int(x)
            return x if -2**53 < x < 2**53 else {"int": hex(x)}
        if isinstance(x, float):
            x = float(x)
            return x if math.isfinite(x) else {"float": repr(x)}
        if isinstance(x, complex):
            x = complex(x)
            return {"complex": [enc(x.real, depth + 1), enc(x.imag, depth + 1)]}
        if isinstance(x, str):
            return str.__str__(x)
        if isinstance(x, (bytes, bytearray)):
            return {"bytes" if isinstance(x, bytes) else "bytearray": bytes(x).hex()}
        if isinstance(x, list):
            return [enc(item, depth + 1) for item in list(x)]
        if isinstance(x, tuple):
            return {"tuple": [enc(item, depth + 1) for item in tuple(x)]}
        if isinstance(x, dict):
            return {"dict": [[enc(k, depth + 1), enc(v, depth + 1)] for k, v in dict(x).items()]}
        if isinstance(x, (set, frozenset)):
            return {"frozenset" if isinstance(x, frozenset) else "set": [enc(item, depth + 1) for item in x]}
        raise TypeError("unplain:" + type(x).__name__)

    if iterate and value is not None and not isinstance(value, plain):
        value = list(value)  # as list(), sorted(), sum() ... would iterate it
    try:
        return True, enc(value, 0)
    except TypeError as error:
        if str(error).startswith("unplain:"):
            return False, str(error)
        raise


def _child_decode(node):
    """A value from the trainer, in ``_child_encode``'s form (trusted input: no bounds needed)."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if type(node) is list:
        return [_child_decode(x) for x in node]
    (tag, body), = node.items()
    if tag == "int":
        return int(body, 16)
    if tag == "float":
        return float(body)
    if tag == "complex":
        return complex(_child_decode(body[0]), _child_decode(body[1]))
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray).fromhex(body)
    if tag == "dict":
        return {_child_decode(k): _child_decode(v) for k, v in body}
    return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](_child_decode(x) for x in body)
