"""rho_actors: an OTP-style actor runtime for an LLM agent's tool calls.

Every call runs in a supervised actor with a deadline; a raise, an exit or a timeout
becomes an error result for the model and never takes the agent down. See DESIGN.md
and README.md; the public API is re-exported here.

rho_actors logs with loguru and, as loguru advises for libraries, is silent until the
host calls ``loguru.logger.enable("rho_actors")``.
"""

from loguru import logger as _logger

from rho_actors.actor import NORMAL, Actor, ActorExit, Down, Monitor, kill, monitor, start_link
from rho_actors.agent import PromptResult, Step, aprompt, prompt
from rho_actors.arguments import ArgumentsError, decode_arguments
from rho_actors.call import CancelToken
from rho_actors.declarations import DeclarationError, UntrustedReads, check_declaration, read_declaration
from rho_actors.encoding import EncodedOutput, encode_output
from rho_actors.events import CallEvent, DeclarationEvent
from rho_actors.formats import DIALECTS, declaration, to_dialect
from rho_actors.function_tool import FunctionTool, tool
from rho_actors.loop import Loop
from rho_actors.model import Message, Model, Reply, ScriptedModel
from rho_actors.registry import DuplicateToolError, Registration
from rho_actors.selftest import SelftestRow, run_selftests
from rho_actors.sources import EntryPointGroup, PluginFolder, Source, SourceHandle
from rho_actors.supervisor import ChildInfo, ChildSpec, RestartIntensityExceeded, StartChild, Supervisor
from rho_actors.system import ActorSystem
from rho_actors.telemetry import Telemetry
from rho_actors.tool import (
    DEFAULT_TIMEOUT_MS,
    Details,
    Error,
    ErrorKind,
    Image,
    Ok,
    ToolCall,
    ToolInfo,
    ToolResult,
    concurrency,
    default_timeout_ms,
    is_tool,
    is_untrusted,
    timeout_ms,
    untrusted,
)

_logger.disable("rho_actors")

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "DIALECTS",
    "NORMAL",
    "Actor",
    "ActorExit",
    "ActorSystem",
    "ArgumentsError",
    "CallEvent",
    "CancelToken",
    "ChildInfo",
    "ChildSpec",
    "DeclarationError",
    "DeclarationEvent",
    "Details",
    "Down",
    "DuplicateToolError",
    "EntryPointGroup",
    "EncodedOutput",
    "Error",
    "ErrorKind",
    "FunctionTool",
    "Image",
    "Loop",
    "Message",
    "Model",
    "Monitor",
    "Ok",
    "PluginFolder",
    "PromptResult",
    "Reply",
    "Registration",
    "RestartIntensityExceeded",
    "ScriptedModel",
    "SelftestRow",
    "Source",
    "SourceHandle",
    "Step",
    "StartChild",
    "Supervisor",
    "Telemetry",
    "ToolCall",
    "ToolInfo",
    "ToolResult",
    "UntrustedReads",
    "check_declaration",
    "concurrency",
    "aprompt",
    "declaration",
    "decode_arguments",
    "default_timeout_ms",
    "encode_output",
    "is_tool",
    "is_untrusted",
    "kill",
    "monitor",
    "prompt",
    "read_declaration",
    "run_selftests",
    "start_link",
    "timeout_ms",
    "to_dialect",
    "tool",
    "untrusted",
]
