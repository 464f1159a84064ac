"""One reply's durable life on a model's cache: its ``app_state`` (``APP_STATE.md``), its text as it becomes
final, the ``Generator`` that runs and autosaves it, ``resume``, and the conversation a name belongs to."""
