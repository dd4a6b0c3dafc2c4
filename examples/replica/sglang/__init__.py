"""A small CPU stand-in for SGLang's start-up (NOT SGLang): the real module paths and method names, so ranktrace's
shipped sglang profile applies unchanged; gloo and a TCPStore underneath. See sglang/launch_server.py."""
