"""The skill: the document the optimizer trains (edits with exact and whitespace-insensitive anchors,
protected blocks, a content hash, unified diffs), the files of an Agent Skills folder held in that one text,
the front matter the Agent Skills spec asks for, reading and writing folders on disk, per-file diffs, and the
text a target is shown.

May import: ``skillopt.core`` (which in turn uses the document's edit records: the two form the foundation).
"""
