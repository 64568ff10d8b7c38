"""The broker's files and formats derived from the CommitLog: ConsumeQueue and IndexFile (a
layout module beside each), the entry batch and fragment formats a DATA entry carries, the
records of an entry (``commands``) and the data directory's format marker."""
