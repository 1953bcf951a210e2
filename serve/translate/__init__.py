"""Other APIs' requests as the one chat request the gateway forwards, and its answers back in
their shapes: Anthropic's Messages (``messages.py``) and OpenAI's Responses (``responses.py``)."""
