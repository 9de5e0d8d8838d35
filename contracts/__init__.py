"""The Temporal wire contract shared by the client (api, services), the workflows and the activities.

Kept out of ``activities/`` so that importing it pulls in no side-effecting module, and out of ``core/``
because it names ``temporalio`` search-attribute keys (``core`` imports no ``temporalio``).
"""
