"""The 20 search queries the latency benchmarks send (everyday PowerShell questions, for the
powershell-docs corpus). Shared by search_latency.py and serve_latency.py; not a script."""

QUERIES = [
    "How do I list files recursively?",
    "remove a registry key",
    "start a background job",
    "compare two objects",
    "convert JSON to an object",
    "what is a script block",
    "set the execution policy",
    "create a PowerShell module",
    "handle errors with try catch",
    "format output as a table",
    "remote session to another computer",
    "filter objects by property",
    "read the content of a file",
    "what are approved verbs",
    "write a cmdlet in C#",
    "pipeline parameter binding",
    "install PowerShell on Linux",
    "environment variables",
    "splatting parameters",
    "string interpolation and escape characters",
]
