"""rho_actors: an OTP-style actor runtime for an LLM agent's tool calls.

Every call runs in a supervised actor with a deadline; a raise, an exit or a timeout
becomes an error result for the model and never takes the agent down. See the
documentation site (docs/: the guides, the design in docs/design/, the reference); the
public API is re-exported here, and only what is here is public
(submodules are documented as internal where they are; ``rho_actors.sandbox``,
``rho_actors.isolation``, ``rho_actors.integrations.bfcl`` and the framework adapters
``rho_actors.integrations.langgraph``, ``.openai_agents`` and ``.pydantic_ai``, imported
only when used, also have their own public names).

rho_actors logs with loguru and, as loguru advises for libraries, is silent until the
host calls ``loguru.logger.enable("rho_actors")``.
"""

from loguru import logger as _logger

from rho_actors.agent.driver import (
    FinalResult,
    PromptEvent,
    PromptResult,
    Session,
    Step,
    StepEnded,
    TaskFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
    aprompt,
    astream,
    prompt,
    stream,
)
from rho_actors.agent.model import Message, Model, Reply, ScriptedModel, Usage
from rho_actors.agent.providers import ModelError, RetryPolicy, model_from_spec
from rho_actors.agent.session_lease import SessionLeaseError
from rho_actors.agent.transcript import TranscriptError
from rho_actors.cancel import CancelToken
from rho_actors.declarations.arguments import ArgumentsError, decode_arguments
from rho_actors.declarations.checks import DeclarationError, check_declaration, read_declaration
from rho_actors.declarations.formats import DIALECTS, Dialect, declaration, to_dialect
from rho_actors.declarations.toolset import ToolEntry, ToolSet
from rho_actors.encoding import EncodedOutput, encode_output
from rho_actors.errors import RhoError
from rho_actors.events import (
    CallEvent,
    DeclarationEvent,
    IsolationEvent,
    ProgressEvent,
    SupervisorEvent,
    ToolSetChanged,
)
from rho_actors.function_tool import FunctionTool, tool
from rho_actors.governor import GovernorSettings
from rho_actors.isolation import ISOLATIONS, Isolation, IsolationServices
from rho_actors.lifecycle import Deferred, PendingCall
from rho_actors.loop.approvals import ApprovalError, CallInfo
from rho_actors.loop.handle import Loop
from rho_actors.otp.actor import NORMAL, Actor, ActorExit, Down, Monitor, kill, monitor, start_link
from rho_actors.otp.names import Names, NotRunningError, whereis
from rho_actors.otp.supervisor import (
    ChildInfo,
    ChildSpec,
    RestartIntensityExceeded,
    StartChild,
    Supervisor,
    count_children,
    which_children,
)
from rho_actors.registry.tool_registry import DuplicateToolError, Registration
from rho_actors.runtime import UntrustedReads
from rho_actors.sandbox import IsolatedReadError, WorkerPool
from rho_actors.selftest import LoadError, SelftestRow, run_selftests
from rho_actors.sources.source_actor import EntryPointGroup, PluginFolder, PluginLoadError, Source, SourceHandle
from rho_actors.system import ActorSystem
from rho_actors.tasks import TaskError, TaskHostStopped, TaskInfo, TaskSettings
from rho_actors.telemetry import Telemetry
from rho_actors.tool import (
    DEFAULT_TIMEOUT_MS,
    Audio,
    Concurrency,
    Details,
    Error,
    ErrorKind,
    Image,
    Ok,
    Resource,
    ToolCall,
    ToolContext,
    ToolFailure,
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
    "PendingCall",
    "Deferred",
    "CallInfo",
    "ApprovalError",
    "DEFAULT_TIMEOUT_MS",
    "DIALECTS",
    "ISOLATIONS",
    "NORMAL",
    "Actor",
    "ActorExit",
    "ActorSystem",
    "ArgumentsError",
    "Audio",
    "CallEvent",
    "CancelToken",
    "ChildInfo",
    "ChildSpec",
    "Concurrency",
    "DeclarationError",
    "DeclarationEvent",
    "Details",
    "Dialect",
    "Down",
    "DuplicateToolError",
    "EncodedOutput",
    "EntryPointGroup",
    "Error",
    "ErrorKind",
    "FinalResult",
    "FunctionTool",
    "GovernorSettings",
    "Image",
    "IsolationEvent",
    "IsolatedReadError",
    "Isolation",
    "IsolationServices",
    "LoadError",
    "Loop",
    "Message",
    "Model",
    "ModelError",
    "Monitor",
    "Names",
    "NotRunningError",
    "Ok",
    "PluginFolder",
    "PluginLoadError",
    "ProgressEvent",
    "PromptEvent",
    "PromptResult",
    "Registration",
    "Reply",
    "Resource",
    "RestartIntensityExceeded",
    "RetryPolicy",
    "RhoError",
    "ScriptedModel",
    "SelftestRow",
    "Session",
    "SessionLeaseError",
    "Source",
    "SourceHandle",
    "StartChild",
    "Step",
    "StepEnded",
    "Supervisor",
    "SupervisorEvent",
    "TaskError",
    "TaskFinished",
    "TaskHostStopped",
    "TaskInfo",
    "TaskSettings",
    "Telemetry",
    "TextDelta",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolEntry",
    "ToolContext",
    "ToolFailure",
    "ToolInfo",
    "ToolResult",
    "ToolSet",
    "ToolSetChanged",
    "TranscriptError",
    "UntrustedReads",
    "Usage",
    "WorkerPool",
    "aprompt",
    "astream",
    "check_declaration",
    "concurrency",
    "count_children",
    "declaration",
    "decode_arguments",
    "default_timeout_ms",
    "encode_output",
    "is_tool",
    "is_untrusted",
    "kill",
    "model_from_spec",
    "monitor",
    "prompt",
    "read_declaration",
    "run_selftests",
    "start_link",
    "stream",
    "timeout_ms",
    "to_dialect",
    "tool",
    "untrusted",
    "whereis",
    "which_children",
]
