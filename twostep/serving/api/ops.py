"""Health, readiness and metrics: GET /healthz (alive), /readyz (the models are loaded, or with --max-loaded the
first of them, and take requests; 503 while loading or draining), /metrics (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from twostep.serving.api import refusals
from twostep.serving.service import Service, error


def router(service: Service) -> APIRouter:
    routes = APIRouter(tags=["operations"])

    @routes.get("/healthz")
    async def healthz():
        return {"status": "alive"}

    @routes.get("/readyz", responses=refusals({503: "Loading or draining"}))
    async def readyz():
        if not service.ready:
            return error(503, "not ready")
        if service.draining:
            return error(503, "draining: shutting down soon")
        return {"status": "ready", "backend": service.backend_name}

    @routes.get("/metrics", response_class=Response,
                responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                                 "description": "Prometheus' text format"}})
    async def metrics():
        return Response(generate_latest(service.registry), media_type=CONTENT_TYPE_LATEST)

    return routes
