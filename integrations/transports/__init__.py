"""Connection transports (see docs/architecture.md); each provider has ``list_tools`` / ``call_tool`` / ``close``."""
