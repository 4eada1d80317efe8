# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The compiled record canonicaliser: gateway.normalise.schema.canonicalise's rules, in C.

An optional speed-up of the Python rules, which are the reference: the build makes it
when a C compiler is at hand, and gateway.normalise.rules decides whether it runs.

It walks a record that jiter has already parsed (dicts, str, int, Decimal, lists;
nothing here reads bytes) and applies the rules of its model, given as a :class:`Plan`
that gateway.normalise.schema builds from the model itself. It decides in C only whether
a string is already canonical (a UUID, a decimal of a scale, an instant, a member of a
set): the checks of gateway.normalise.coercions, written again in C. Every coercion is
the Python one of gateway.normalise.coercions, called from here, and so are the errors.
tests/normalise/test_compiled.py holds it to gateway.normalise.schema's Python
``canonicalise_python`` on generated records: the same output, coercion counts,
unknown values, dropped fields and errors.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_Size
from cpython.object cimport PyObject
from libc.string cimport memchr

from gateway.normalise.coercions import REQUIRED_REASON, CanonicalError, json_type


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    const char* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)


# What a step checks before calling its coercion (gateway.normalise.schema builds the steps).
cdef enum:
    _NONE = 0
    _UUID = 1
    _DECIMAL = 2
    _INSTANT = 3
    _MEMBER = 4
    _CALL = 5
    _TEXT_LIST = 6

CHECK_NONE = _NONE
CHECK_UUID = _UUID
CHECK_DECIMAL = _DECIMAL
CHECK_INSTANT = _INSTANT
CHECK_MEMBER = _MEMBER
CHECK_CALL = _CALL
CHECK_TEXT_LIST = _TEXT_LIST

cdef frozenset _NOTHING = frozenset()


cdef class Step:
    """One field with a rule: its check and its coercion."""

    cdef readonly str name
    cdef readonly str qualified
    cdef readonly int check
    cdef readonly int scale
    cdef readonly int max_scale
    cdef readonly object argument
    cdef readonly object coerce
    cdef tuple _last  # (kind, (qualified, kind)) of the last coercion counted

    def __init__(self, str name, str qualified, int check, object argument, object coerce,
                 int scale=0, int max_scale=0):
        if not _NONE <= check <= _TEXT_LIST:
            raise ValueError(f"unknown check {check}")
        if check == _MEMBER and not isinstance(argument, (set, frozenset)):
            raise TypeError("a membership check needs a set")
        if check == _DECIMAL and not 0 <= scale <= max_scale:
            raise ValueError("a decimal check needs 0 <= scale <= max_scale")
        self.name = name
        self.qualified = qualified
        self.check = check
        self.argument = argument
        self.coerce = coerce
        self.scale = scale
        self.max_scale = max_scale
        self._last = (None, None)

    cdef tuple key_of(self, str kind):
        """(qualified, kind): made once per kind in a row, not once per count (kept as
        one tuple, so that a reader never pairs one kind with another's key)."""
        cdef tuple last = self._last
        if last[0] is not kind:
            last = self._last = (kind, (self.qualified, kind))
        return <tuple>last[1]


cdef class Plan:
    """One model's rules, in the order canonicalise applies them."""

    cdef readonly str model_name
    cdef readonly tuple order            # every field, in the published order
    cdef readonly frozenset names        # the same, as a set
    cdef readonly tuple qualified        # ("Expense.id", ...) in the order of ``order``
    cdef readonly frozenset derived      # fields the model may fill itself (_complete)
    cdef readonly tuple required         # fields that are never null (every id)
    cdef readonly tuple texts            # text fields: a str or null, kept as sent
    cdef readonly tuple steps            # Step of every field with a rule
    cdef readonly tuple nested           # (field, Plan) of embedded records
    cdef readonly object complete        # model._complete, or None when it does nothing
    cdef tuple missing_keys              # (qualified, "missing->null") in the order of order
    cdef tuple extra_key                 # (model_name, "extra-field-dropped")

    def __init__(self, str model_name, tuple order, tuple qualified, frozenset derived,
                 tuple required, tuple texts, tuple steps, tuple nested, object complete):
        if len(order) != len(qualified):
            raise ValueError("order and qualified differ in length")
        for step in steps:
            if not isinstance(step, Step):
                raise TypeError("steps must be Step")
        for pair in nested:
            if not isinstance(pair[1], Plan):
                raise TypeError("nested must be (field, Plan)")
        self.model_name = model_name
        self.order = order
        self.names = frozenset(order)
        self.qualified = qualified
        self.derived = derived
        self.required = required
        self.texts = texts
        self.steps = steps
        self.nested = nested
        self.complete = complete
        self.missing_keys = tuple((name, "missing->null") for name in qualified)
        self.extra_key = (model_name, "extra-field-dropped")


cdef inline bint _digit(char c) noexcept:
    return b'0' <= c <= b'9'


cdef inline bint _hex(char c) noexcept:
    return _digit(c) or b'a' <= c <= b'f'


cdef inline int _number(const char* s, Py_ssize_t start, Py_ssize_t count) noexcept:
    cdef int value = 0
    cdef Py_ssize_t i
    for i in range(start, start + count):
        value = value * 10 + (s[i] - 48)
    return value


cdef bint is_uuid(str value):
    """``[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}``, whole."""
    if PyUnicode_GET_LENGTH(value) != 36 or not PyUnicode_IS_ASCII(value):
        return False
    cdef const char* s = PyUnicode_DATA(value)
    cdef Py_ssize_t i
    for i in range(36):
        if i == 8 or i == 13 or i == 18 or i == 23:
            if s[i] != b'-':
                return False
        elif not _hex(s[i]):
            return False
    return True


cdef bint is_decimal(str value, int scale, int max_scale):
    """``-?(?:0|[1-9][0-9]{0,39})\\.[0-9]{scale,max_scale}``, whole, and not ``-0.0...``."""
    cdef Py_ssize_t length = PyUnicode_GET_LENGTH(value)
    if length < 2 or not PyUnicode_IS_ASCII(value):
        return False
    cdef const char* s = PyUnicode_DATA(value)
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t start
    if s[0] == b'-':
        i = 1
    start = i
    if i < length and s[i] == b'0':
        i += 1
    elif i < length and b'1' <= s[i] <= b'9':
        i += 1
        while i < length and _digit(s[i]) and i - start < 40:
            i += 1
    else:
        return False
    if i >= length or s[i] != b'.':
        return False
    i += 1
    start = i
    while i < length and _digit(s[i]):
        i += 1
    if i != length or not scale <= length - start <= max_scale:
        return False
    # the Python check's "not value.startswith('-0.0')"
    return not (length >= 4 and s[0] == b'-' and s[1] == b'0' and s[2] == b'.' and s[3] == b'0')


cdef inline bint _leap(int year) noexcept:
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


cdef int[13] _MONTH_DAYS = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


cdef bint is_instant(str value):
    """``YYYY-MM-DDTHH:MM:SS(.fff)?Z``, whole, and a real moment of the years 1 to 9999
    (what datetime.fromisoformat accepts of that shape)."""
    cdef Py_ssize_t length = PyUnicode_GET_LENGTH(value)
    if (length != 20 and length != 24) or not PyUnicode_IS_ASCII(value):
        return False
    cdef const char* s = PyUnicode_DATA(value)
    cdef Py_ssize_t i
    for i in range(19):
        if i == 4 or i == 7:
            if s[i] != b'-':
                return False
        elif i == 10:
            if s[i] != b'T':
                return False
        elif i == 13 or i == 16:
            if s[i] != b':':
                return False
        elif not _digit(s[i]):
            return False
    if length == 24:
        if s[19] != b'.' or not (_digit(s[20]) and _digit(s[21]) and _digit(s[22])):
            return False
    if s[length - 1] != b'Z':
        return False
    cdef int year = _number(s, 0, 4)
    cdef int month = _number(s, 5, 2)
    cdef int day = _number(s, 8, 2)
    if year < 1 or month < 1 or month > 12 or day < 1:
        return False
    if day > _MONTH_DAYS[month] + (1 if month == 2 and _leap(year) else 0):
        return False
    return _number(s, 11, 2) <= 23 and _number(s, 14, 2) <= 59 and _number(s, 17, 2) <= 59


cdef bint _canonical(Step step, str value) except -1:
    cdef int check = step.check
    if check == _UUID:
        return is_uuid(value)
    if check == _DECIMAL:
        return is_decimal(value, step.scale, step.max_scale)
    if check == _INSTANT:
        return is_instant(value)
    if check == _MEMBER:
        return value in step.argument
    if check == _CALL:
        return bool(step.argument(value))
    return False


cdef bint _texts(list value) noexcept:
    for item in value:
        if type(item) is not str:
            return False
    return True


cdef inline bint _already(Step step, object value) except -1:
    """Whether ``value`` is already canonical for ``step`` (its coercion would return it
    as it is, with no kind): a string its check accepts, or a list of text."""
    if type(value) is str:
        return _canonical(step, value)
    return step.check == _TEXT_LIST and type(value) is list and _texts(value)


def check(Step step, object value):
    """What ``step`` decides about a value: True when it is already canonical."""
    return _already(step, value)


cdef inline void _count(object coercions, tuple key) except *:
    # coercions is the context's Counter, a dict: read as a dict (a missing key is
    # not there, rather than Counter's 0), written as a dict; the same counts
    cdef PyObject* seen = PyDict_GetItem(coercions, key)
    coercions[key] = 1 if seen is NULL else <object>seen + 1


cdef bint _in_order(dict data, tuple order) except -1:
    cdef Py_ssize_t position = 0
    cdef Py_ssize_t index = 0
    cdef PyObject* key
    cdef PyObject* value
    if PyDict_Size(data) != len(order):
        return False
    while PyDict_Next(data, &position, &key, &value):
        if <object>key != order[index]:
            return False
        index += 1
    return True


cdef tuple _reshape(Plan plan, dict data, object context):
    """Every field in the published order; missing ones null, unknown ones dropped.
    Also the missing fields the model may derive (counted by its _complete)."""
    cdef object coercions = context.coercions
    cdef str model_name = plan.model_name
    for key in data:
        if key not in plan.names:
            _count(coercions, plan.extra_key)
            context.dropped.add(f"{model_name}.{key}")
    cdef dict shaped = {}
    cdef list derived = []
    cdef Py_ssize_t index
    cdef PyObject* found
    for index in range(len(plan.order)):
        key = plan.order[index]
        found = PyDict_GetItem(data, key)
        if found is NULL:
            shaped[key] = None
            if key in plan.derived:
                derived.append(key)
            else:
                _count(coercions, plan.missing_keys[index])
        else:
            shaped[key] = <object>found
    return shaped, frozenset(derived) if derived else _NOTHING


def canonicalise(Plan plan, dict data, object context):
    """Bring one parsed record and its embedded records to canonical form, in place
    where it can; returns it. Raises CanonicalError locating the first bad value."""
    cdef frozenset missing = _NOTHING
    if not _in_order(data, plan.order):
        data, missing = _reshape(plan, data, context)
    for name in plan.required:
        if data[name] is None:
            raise CanonicalError(name, REQUIRED_REASON)
    for name in plan.texts:
        value = data[name]
        if value is not None and type(value) is not str:
            raise CanonicalError(name, f"a JSON {json_type(value)} where text is expected")
    cdef object coercions = context.coercions
    cdef Step step
    for step in plan.steps:
        value = data[step.name]
        if value is None:
            continue
        if _already(step, value):
            continue
        try:
            canonical, kind = step.coerce(value)
        except ValueError as exc:
            raise CanonicalError(step.name, str(exc)) from None
        if kind is not None:
            if kind == "unknown-value":
                context.unknown_values.add((step.qualified, canonical))
            _count(coercions, step.key_of(kind))
        data[step.name] = canonical
    cdef Plan embedded
    for name, embedded in plan.nested:
        value = data[name]
        if value is None:
            continue
        if type(value) is not dict:
            raise CanonicalError(name, f"a JSON {json_type(value)} where an object is expected")
        try:
            data[name] = canonicalise(embedded, value, context)
        except CanonicalError as exc:
            raise exc.within(name) from None
    if plan.complete is not None:
        # _complete fills derived fields that are null; with none null it does nothing
        for name in plan.derived:
            if data[name] is None:
                return plan.complete(data, context, missing)
    return data


def canonicalise_items(Plan plan, list items, object context):
    """canonicalise() each record of a list, in place. A CanonicalError's path starts
    with the record's index; an item that is not an object is one at its index."""
    cdef Py_ssize_t index
    for index in range(len(items)):
        item = items[index]
        if type(item) is not dict:
            raise CanonicalError(index, f"a JSON {json_type(item)} where an object is expected")
        try:
            items[index] = canonicalise(plan, item, context)
        except CanonicalError as exc:
            raise exc.within(index) from None


def holds_float(object value):
    """Whether a ``float`` is anywhere in ``value``, a JSON document as jiter parses it
    (dicts with string keys, lists, str, int, float, bool, None): gateway.normalise.normaliser
    parses with floats first, the quick way, and again with Decimals when this is
    True."""
    return _holds_float(value)


cdef bint _holds_float(object value) except -1:
    cdef type kind = type(value)
    cdef Py_ssize_t position = 0
    cdef PyObject* key
    cdef PyObject* item
    if kind is float:
        return True
    if kind is dict:
        while PyDict_Next(value, &position, &key, &item):
            if _holds_float(<object>item):
                return True
    elif kind is list:
        for member in <list>value:
            if _holds_float(member):
                return True
    return False


def shape(object value):
    """``(holds a float, entries)`` of ``value``, a JSON document as jiter parses it:
    whether a ``float`` is anywhere in it (see :func:`holds_float`), and how many
    entries its dicts hold together. A body whose objects have no repeated key has as
    many entries as :func:`members` counts in its text; jiter keeps one entry of a
    repeated key, so fewer entries means a key was repeated."""
    cdef Py_ssize_t entries = 0
    floats = _shape(value, &entries)
    return floats, entries


cdef bint _shape(object value, Py_ssize_t* entries) except -1:
    cdef type kind = type(value)
    cdef Py_ssize_t position = 0
    cdef PyObject* key
    cdef PyObject* item
    cdef bint floats = False
    if kind is float:
        return True
    if kind is dict:
        entries[0] += PyDict_Size(value)
        while PyDict_Next(value, &position, &key, &item):
            if _shape(<object>item, entries):
                floats = True
    elif kind is list:
        for member in <list>value:
            if _shape(member, entries):
                floats = True
    return floats


def members(bytes body):
    """How many members the objects of ``body``, a valid JSON text, hold together: the
    colons outside its strings (each member has one, and nothing else in JSON outside
    a string is a colon). A string is skipped to its closing quote, the first not
    escaped by an odd run of backslashes."""
    cdef const char* text = PyBytes_AS_STRING(body)
    cdef Py_ssize_t length = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t count = 0
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t quote
    cdef Py_ssize_t back
    cdef const char* found
    cdef char c
    while i < length:
        c = text[i]
        i += 1
        if c == b':':
            count += 1
        elif c == b'"':
            while True:
                found = <const char*>memchr(text + i, b'"', length - i)
                if found == NULL:
                    return count  # an unclosed string: not JSON, which jiter refused
                quote = found - text
                back = quote
                while back > i and text[back - 1] == b'\\':
                    back -= 1
                i = quote + 1
                if (quote - back) % 2 == 0:
                    break
    return count
