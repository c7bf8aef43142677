"""Serving: a Ray Serve + FastAPI chat endpoint over any rayseq checkpoint.

Depends on models + checkpoint only (DESIGN.md), never on ``rayseq.distributed``.
"""
