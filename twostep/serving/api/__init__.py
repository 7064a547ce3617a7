"""The HTTP APIs of `twostep serve`, one router module each over the one Service (twostep.serving.service):
`v1` (twostep's own), `libretranslate` (LibreTranslate's, for its clients) and `ops` (health, readiness,
metrics). twostep.serving.http.build_app composes them with the shared middleware."""
