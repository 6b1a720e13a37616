"""Benchmarks (not timed tests): `stoke bench kv|ui|attach|serve|tools|prefill|cpu-buffers|
decode|dsv4-reference|engines`, device scripts; each prints a table and writes JSON (the top-level
bench/results/ holds the runs docs/ quotes).

May import: every room, the window included (`bench ui` streams into it). Nothing imports
this room but `app.cli.bench`.
"""
