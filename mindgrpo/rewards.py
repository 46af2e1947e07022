"""Rule-based reward functions (verifiers). Placeholder: only the shared number normaliser so far."""
import re
from decimal import Decimal, InvalidOperation
from typing import Optional

_NUMBER_CHARS = re.compile(r"[\s$,€£¥%]")


def normalize_number(text: str) -> Optional[str]:
    """Canonical string for a numeric answer, or None when `text` is not a number.

    `72`, `72.0`, `72.00`, `$72`, `1,000`/`1000` all normalise to the same string, so gold answers stored in
    the dataset and answers extracted from completions compare with `==`.
    """
    cleaned = _NUMBER_CHARS.sub("", text or "").rstrip(".")
    if not cleaned:
        return None
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    value = value.normalize()
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return format(value, "f")
