"""Tool schemas in the OpenAI function-calling format, and what a tool returns.

The class names and fields are those of verl's ``verl.tools.schemas``, so a tool class written for
verl (``from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse``) imports and runs
here unchanged. They are pydantic models: ``OpenAIFunctionToolSchema.model_validate(dict)`` reads
the ``tool_schema`` block of a tool YAML, ``model_dump()`` gives the dict a chat template's
``tools=`` argument takes.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator


class OpenAIFunctionPropertySchema(BaseModel):
    """One parameter: its JSON type (a list for unions, e.g. ``["integer", "number"]``)."""

    model_config = {"extra": "allow"}  # items, minimum, ... pass through to the chat template

    type: str | list[str]
    description: str | None = None
    enum: list[Any] | None = None


class OpenAIFunctionParametersSchema(BaseModel):
    type: str = "object"
    properties: dict[str, OpenAIFunctionPropertySchema] = Field(default_factory=dict)
    required: list[str] = Field(default_factory=list)


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str = ""
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=OpenAIFunctionParametersSchema)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    type: str = "function"
    function: OpenAIFunctionSchema


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as a parser found it: the name and the arguments' JSON text."""

    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with its arguments decoded."""

    name: str
    arguments: dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(parsed: OpenAIFunctionParsedSchema) -> tuple[OpenAIFunctionCallSchema, bool]:
        """The decoded call and whether its arguments failed to decode (then they are ``{}``)."""
        try:
            arguments = json.loads(parsed.arguments)
        except (json.JSONDecodeError, RecursionError):  # RecursionError: brackets nested past the limit
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """What a tool's ``execute`` returns to the conversation. Only text is supported here (images and
    videos need a vision-language model, which this project does not train)."""

    text: str | None = None
    image: list[Any] | None = None
    video: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _lists_only(cls, values):
        if isinstance(values, dict):
            for key in ("image", "video"):
                if key in values and values[key] is not None and not isinstance(values[key], list):
                    raise ValueError(f"ToolResponse.{key} must be a list (wrap one item as [item]), got "
                                     f"{type(values[key]).__name__}")
        return values

    def is_empty(self) -> bool:
        return not self.text and not self.image and not self.video

    def is_text_only(self) -> bool:
        return bool(self.text) and not self.image and not self.video
