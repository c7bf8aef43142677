"""A FastAPI app answering GET /health, served by the child-server tests."""

from fastapi import FastAPI

app = FastAPI()


@app.get("/health")
def health():
    return {"status": "ok"}
