"""The HTTP APIs of `twostep serve`, one router module each over the one Service (twostep.serving.service):
`v1` (twostep's own), `libretranslate` (LibreTranslate's, for its clients) and `ops` (health, readiness,
metrics). twostep.serving.http.build_app composes them with the shared middleware.

Every error of every API is JSON, `Error`: {"error": message}. Each API states its refusals in its routes'
`responses` (`refusals`); every operation may also answer 500 (a bug), which twostep.serving.http adds to the
API document."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Error(BaseModel):
    """What every API answers for an error."""

    error: str = Field(description="What went wrong, and what to do about it.")


def refusals(described: dict[int, str]) -> dict[int, dict]:
    """A route's `responses` for its error statuses (status: what it means), each an Error."""
    return {status: {"model": Error, "description": description} for status, description in described.items()}
