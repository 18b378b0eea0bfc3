from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_STATE_UNSPECIFIED: _ClassVar[SessionState]
    SESSION_STATE_CREATING: _ClassVar[SessionState]
    SESSION_STATE_READY: _ClassVar[SessionState]
    SESSION_STATE_CLOSING: _ClassVar[SessionState]
    SESSION_STATE_CLOSED: _ClassVar[SessionState]
    SESSION_STATE_FAILED: _ClassVar[SessionState]

class EvaluateMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVALUATE_MODE_UNSPECIFIED: _ClassVar[EvaluateMode]
    EVALUATE_MODE_CLEAN_ROOM: _ClassVar[EvaluateMode]
    EVALUATE_MODE_IN_PLACE: _ClassVar[EvaluateMode]
SESSION_STATE_UNSPECIFIED: SessionState
SESSION_STATE_CREATING: SessionState
SESSION_STATE_READY: SessionState
SESSION_STATE_CLOSING: SessionState
SESSION_STATE_CLOSED: SessionState
SESSION_STATE_FAILED: SessionState
EVALUATE_MODE_UNSPECIFIED: EvaluateMode
EVALUATE_MODE_CLEAN_ROOM: EvaluateMode
EVALUATE_MODE_IN_PLACE: EvaluateMode

class DrainRequest(_message.Message):
    __slots__ = ("undo", "node_id")
    UNDO_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    undo: bool
    node_id: str
    def __init__(self, undo: _Optional[bool] = ..., node_id: _Optional[str] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("draining", "sessions")
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    draining: bool
    sessions: int
    def __init__(self, draining: _Optional[bool] = ..., sessions: _Optional[int] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterNode(_message.Message):
    __slots__ = ("node_id", "address", "sessions", "max_sessions", "free", "ready", "load1", "serving", "age", "draining")
    class ReadyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    AGE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    sessions: int
    max_sessions: int
    free: int
    ready: _containers.ScalarMap[str, int]
    load1: float
    serving: bool
    age: float
    draining: bool
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., free: _Optional[int] = ..., ready: _Optional[_Mapping[str, int]] = ..., load1: _Optional[float] = ..., serving: _Optional[bool] = ..., age: _Optional[float] = ..., draining: _Optional[bool] = ...) -> None: ...

class Cluster(_message.Message):
    __slots__ = ("nodes", "answered_by")
    NODES_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_BY_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[ClusterNode]
    answered_by: str
    def __init__(self, nodes: _Optional[_Iterable[_Union[ClusterNode, _Mapping]]] = ..., answered_by: _Optional[str] = ...) -> None: ...

class ForkRequest(_message.Message):
    __slots__ = ("session_id", "count", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    count: int
    labels: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., count: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ForkResponse(_message.Message):
    __slots__ = ("sessions", "bytes_copied", "paths_copied", "paths_deleted")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    BYTES_COPIED_FIELD_NUMBER: _ClassVar[int]
    PATHS_COPIED_FIELD_NUMBER: _ClassVar[int]
    PATHS_DELETED_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    bytes_copied: int
    paths_copied: int
    paths_deleted: int
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., bytes_copied: _Optional[int] = ..., paths_copied: _Optional[int] = ..., paths_deleted: _Optional[int] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("spec_json", "workspace_tar", "ref")
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    WORKSPACE_TAR_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    workspace_tar: bytes
    ref: str
    def __init__(self, spec_json: _Optional[str] = ..., workspace_tar: _Optional[bytes] = ..., ref: _Optional[str] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ("task", "count", "ttl")
    TASK_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    task: Task
    count: int
    ttl: float
    def __init__(self, task: _Optional[_Union[Task, _Mapping]] = ..., count: _Optional[int] = ..., ttl: _Optional[float] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ("ref", "ready", "preparing", "target", "last_error")
    REF_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    PREPARING_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    ref: str
    ready: int
    preparing: int
    target: int
    last_error: str
    def __init__(self, ref: _Optional[str] = ..., ready: _Optional[int] = ..., preparing: _Optional[int] = ..., target: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("pool", "env", "workdir", "idle_timeout", "max_lifetime", "labels", "idempotency_key", "acquire_timeout", "task", "image")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_LIFETIME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    pool: str
    env: _containers.ScalarMap[str, str]
    workdir: str
    idle_timeout: float
    max_lifetime: float
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    acquire_timeout: float
    task: Task
    image: str
    def __init__(self, pool: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., workdir: _Optional[str] = ..., idle_timeout: _Optional[float] = ..., max_lifetime: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., acquire_timeout: _Optional[float] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., image: _Optional[str] = ...) -> None: ...

class Session(_message.Message):
    __slots__ = ("session_id", "node_id", "pool", "state", "labels", "image", "mode", "oci_runtime", "workdir", "created_at", "last_used_at", "idle_timeout", "max_lifetime", "steps", "container_name", "end_reason", "task_id")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    OCI_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_LIFETIME_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_NAME_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    node_id: str
    pool: str
    state: SessionState
    labels: _containers.ScalarMap[str, str]
    image: str
    mode: str
    oci_runtime: str
    workdir: str
    created_at: float
    last_used_at: float
    idle_timeout: float
    max_lifetime: float
    steps: int
    container_name: str
    end_reason: str
    task_id: str
    def __init__(self, session_id: _Optional[str] = ..., node_id: _Optional[str] = ..., pool: _Optional[str] = ..., state: _Optional[_Union[SessionState, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., image: _Optional[str] = ..., mode: _Optional[str] = ..., oci_runtime: _Optional[str] = ..., workdir: _Optional[str] = ..., created_at: _Optional[float] = ..., last_used_at: _Optional[float] = ..., idle_timeout: _Optional[float] = ..., max_lifetime: _Optional[float] = ..., steps: _Optional[int] = ..., container_name: _Optional[str] = ..., end_reason: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class GetSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("labels", "pool")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    pool: str
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., pool: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    def __init__(self, sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("session_id", "argv", "shell", "shell_session", "cwd", "env", "stdin", "timeout", "stdout_cap", "stderr_cap", "seq")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    SHELL_SESSION_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_CAP_FIELD_NUMBER: _ClassVar[int]
    STDERR_CAP_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    argv: Argv
    shell: str
    shell_session: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    stdin: bytes
    timeout: float
    stdout_cap: int
    stderr_cap: int
    seq: int
    def __init__(self, session_id: _Optional[str] = ..., argv: _Optional[_Union[Argv, _Mapping]] = ..., shell: _Optional[str] = ..., shell_session: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., stdin: _Optional[bytes] = ..., timeout: _Optional[float] = ..., stdout_cap: _Optional[int] = ..., stderr_cap: _Optional[int] = ..., seq: _Optional[int] = ...) -> None: ...

class Argv(_message.Message):
    __slots__ = ("args",)
    ARGS_FIELD_NUMBER: _ClassVar[int]
    args: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, args: _Optional[_Iterable[str]] = ...) -> None: ...

class ExecResult(_message.Message):
    __slots__ = ("exit_code", "signal", "timed_out", "stdout", "stderr", "stdout_total", "stderr_total", "stdout_truncated", "stderr_truncated", "duration", "replayed", "shell_exited")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_TOTAL_FIELD_NUMBER: _ClassVar[int]
    STDOUT_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STDERR_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SHELL_EXITED_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    signal: int
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float
    replayed: bool
    shell_exited: bool
    def __init__(self, exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., timed_out: _Optional[bool] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., stdout_total: _Optional[int] = ..., stderr_total: _Optional[int] = ..., stdout_truncated: _Optional[bool] = ..., stderr_truncated: _Optional[bool] = ..., duration: _Optional[float] = ..., replayed: _Optional[bool] = ..., shell_exited: _Optional[bool] = ...) -> None: ...

class ExecStreamEvent(_message.Message):
    __slots__ = ("stdout", "stderr", "result")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    result: ExecResult
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., result: _Optional[_Union[ExecResult, _Mapping]] = ...) -> None: ...

class ExecBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ExecRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ExecRequest, _Mapping]]] = ...) -> None: ...

class ExecBatchItem(_message.Message):
    __slots__ = ("result", "error")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    result: ExecResult
    error: Error
    def __init__(self, result: _Optional[_Union[ExecResult, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ExecBatchResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ExecBatchItem]
    def __init__(self, items: _Optional[_Iterable[_Union[ExecBatchItem, _Mapping]]] = ...) -> None: ...

class FileContent(_message.Message):
    __slots__ = ("path", "data", "mode")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    path: str
    data: bytes
    mode: int
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ...) -> None: ...

class WriteFilesRequest(_message.Message):
    __slots__ = ("session_id", "files")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    files: _containers.RepeatedCompositeFieldContainer[FileContent]
    def __init__(self, session_id: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileContent, _Mapping]]] = ...) -> None: ...

class WriteFilesResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadFilesRequest(_message.Message):
    __slots__ = ("session_id", "paths", "max_bytes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PATHS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    paths: _containers.RepeatedScalarFieldContainer[str]
    max_bytes: int
    def __init__(self, session_id: _Optional[str] = ..., paths: _Optional[_Iterable[str]] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FileData(_message.Message):
    __slots__ = ("path", "data", "size", "truncated", "error")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    path: str
    data: bytes
    size: int
    truncated: bool
    error: str
    def __init__(self, path: _Optional[str] = ..., data: _Optional[bytes] = ..., size: _Optional[int] = ..., truncated: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class ReadFilesResponse(_message.Message):
    __slots__ = ("files",)
    FILES_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileData]
    def __init__(self, files: _Optional[_Iterable[_Union[FileData, _Mapping]]] = ...) -> None: ...

class GetNodeStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("name", "image", "ready", "in_use", "creating", "waiting", "min_ready", "max_total", "created_total", "failed_total", "consecutive_failures", "last_error", "oci_runtime", "acquired_total", "acquired_waited_total", "destroying", "recycling", "recycled_total", "recycle_failures_total")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    CREATING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    MIN_READY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    FAILED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    OCI_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_WAITED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    DESTROYING_FIELD_NUMBER: _ClassVar[int]
    RECYCLING_FIELD_NUMBER: _ClassVar[int]
    RECYCLED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RECYCLE_FAILURES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    name: str
    image: str
    ready: int
    in_use: int
    creating: int
    waiting: int
    min_ready: int
    max_total: int
    created_total: int
    failed_total: int
    consecutive_failures: int
    last_error: str
    oci_runtime: str
    acquired_total: int
    acquired_waited_total: int
    destroying: int
    recycling: int
    recycled_total: int
    recycle_failures_total: int
    def __init__(self, name: _Optional[str] = ..., image: _Optional[str] = ..., ready: _Optional[int] = ..., in_use: _Optional[int] = ..., creating: _Optional[int] = ..., waiting: _Optional[int] = ..., min_ready: _Optional[int] = ..., max_total: _Optional[int] = ..., created_total: _Optional[int] = ..., failed_total: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., last_error: _Optional[str] = ..., oci_runtime: _Optional[str] = ..., acquired_total: _Optional[int] = ..., acquired_waited_total: _Optional[int] = ..., destroying: _Optional[int] = ..., recycling: _Optional[int] = ..., recycled_total: _Optional[int] = ..., recycle_failures_total: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "version", "pools", "sessions", "max_sessions", "docker_reachable", "serving", "load1", "uptime", "execs_total", "events")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    DOCKER_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    UPTIME_FIELD_NUMBER: _ClassVar[int]
    EXECS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    version: str
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    sessions: int
    max_sessions: int
    docker_reachable: bool
    serving: bool
    load1: float
    uptime: float
    execs_total: int
    events: EventsStatus
    def __init__(self, node_id: _Optional[str] = ..., version: _Optional[str] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ..., sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ..., docker_reachable: _Optional[bool] = ..., serving: _Optional[bool] = ..., load1: _Optional[float] = ..., uptime: _Optional[float] = ..., execs_total: _Optional[int] = ..., events: _Optional[_Union[EventsStatus, _Mapping]] = ...) -> None: ...

class EventsStatus(_message.Message):
    __slots__ = ("connected", "published_total", "queued", "outbox_events", "outbox_bytes", "outbox_max_bytes", "dropped_total", "last_error")
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTBOX_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    connected: bool
    published_total: int
    queued: int
    outbox_events: int
    outbox_bytes: int
    outbox_max_bytes: int
    dropped_total: int
    last_error: str
    def __init__(self, connected: _Optional[bool] = ..., published_total: _Optional[int] = ..., queued: _Optional[int] = ..., outbox_events: _Optional[int] = ..., outbox_bytes: _Optional[int] = ..., outbox_max_bytes: _Optional[int] = ..., dropped_total: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("session_id", "task", "mode", "timeout")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    task: Task
    mode: EvaluateMode
    timeout: float
    def __init__(self, session_id: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., mode: _Optional[_Union[EvaluateMode, str]] = ..., timeout: _Optional[float] = ...) -> None: ...

class TestOutcome(_message.Message):
    __slots__ = ("id", "outcome", "group")
    ID_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    id: str
    outcome: str
    group: str
    def __init__(self, id: _Optional[str] = ..., outcome: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class GradeResult(_message.Message):
    __slots__ = ("status", "reward", "resolved", "message", "tests", "counts", "exit_code", "timed_out", "report_complete", "tampering", "log", "duration", "mode", "task_id", "session_id", "limits")
    class CountsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TESTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    REPORT_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    TAMPERING_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    status: str
    reward: float
    resolved: bool
    message: str
    tests: _containers.RepeatedCompositeFieldContainer[TestOutcome]
    counts: _containers.ScalarMap[str, int]
    exit_code: int
    timed_out: bool
    report_complete: bool
    tampering: _containers.RepeatedScalarFieldContainer[str]
    log: bytes
    duration: float
    mode: str
    task_id: str
    session_id: str
    limits: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, status: _Optional[str] = ..., reward: _Optional[float] = ..., resolved: _Optional[bool] = ..., message: _Optional[str] = ..., tests: _Optional[_Iterable[_Union[TestOutcome, _Mapping]]] = ..., counts: _Optional[_Mapping[str, int]] = ..., exit_code: _Optional[int] = ..., timed_out: _Optional[bool] = ..., report_complete: _Optional[bool] = ..., tampering: _Optional[_Iterable[str]] = ..., log: _Optional[bytes] = ..., duration: _Optional[float] = ..., mode: _Optional[str] = ..., task_id: _Optional[str] = ..., session_id: _Optional[str] = ..., limits: _Optional[_Iterable[str]] = ...) -> None: ...
