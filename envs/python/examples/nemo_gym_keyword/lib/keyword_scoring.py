"""The keyword server's scoring (imported from the YAML's environment: PYTHONPATH)."""


def reply_text(response):
    """The assistant text of a Responses-API response (its output messages' text parts)."""
    parts = []
    for item in response.output:
        for part in getattr(item, "content", None) or []:
            text = getattr(part, "text", None)
            if isinstance(text, str):
                parts.append(text)
    return "\n".join(parts)


def contains_keyword(text, keyword):
    return keyword.lower() in text.lower()
