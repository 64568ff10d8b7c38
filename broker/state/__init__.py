"""The broker's replicated state, one small typed table per module, composed by
``broker.state.derived.DerivedState`` and driven by ``broker.state.machine``.

Each table owns its data under typed keys (``broker.state.keys``), the apply operations
on it, ``forget_topic`` where a deleted topic leaves something behind, expiry by store
time where entries expire, and its checkpoint form (``state()``, and the constructor
reading it back): ``topics``, ``offsets``, ``producers``, ``locks``, ``send_backs``,
``deferral`` (held messages); ``queues`` (ConsumeQueue files), ``chain`` (fragments being
collected), ``outcome`` (what applying a record did), ``checkpoint`` (the checkpoint file).
"""
