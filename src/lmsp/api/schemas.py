"""Request bodies (pure parsing). Validation errors become ``400`` with ``param``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator


class InputText(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["input_text", "output_text", "text"]
    text: str


class InputMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class CreateResponse(BaseModel):
    """``POST /v1/responses``: the OpenAI Responses fields lmsp honours, plus ``seed`` and
    ``on_restart``. Unknown fields are ignored, as OpenAI-style clients expect."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    input: (
        Annotated[str, StringConstraints(min_length=1)]
        | Annotated[list[InputMessage], Field(min_length=1)]
    )
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    metadata: dict[MetadataKey, MetadataValue] | None = None
    seed: Annotated[int, Field(ge=0, le=2**63 - 1)] | None = None
    on_restart: Literal["fail", "retry", "resume"] | None = None

    @field_validator("metadata")
    @classmethod
    def _at_most_16(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None and len(value) > 16:
            raise ValueError("metadata holds at most 16 pairs")
        return value
