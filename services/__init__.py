"""Application services shared by the HTTP front door and the worker (run creation, trigger firing)."""
