"""The six record routes of the Financial Records Read API, declared once."""

from __future__ import annotations

from gateway.normalise.pages import AccountPage, ClientPage, ExpensePage, UserPage
from gateway.normalise.schema import Account, Expense
from gateway.routing.parameters import (
    Amount,
    Choice,
    Day,
    Integer,
    PageSize,
    Param,
    Text,
    Uuid,
)
from gateway.routing.routes import NotAfter, Route, RouteTable
from gateway.routing.sampling import DaysAround, Each, First, Fixed, Spread, Together, Word

# the reference upstream's own bound (nine digits): a larger page it refuses with 400,
# which would reach the caller as a 502
MAX_PAGE = 999_999_999
DEFAULT_PAGE = 1
DEFAULT_LIMIT = 10
TYPES = ("CASH", "BANK")
# ids no record has: compare asks for them too, to compare the upstreams' 404s
UNKNOWN_EXPENSE = "00000000-0000-4000-8000-000000000000"
UNKNOWN_ACCOUNT = "records-gateway-compare-no-such-account"

PAGE = Param("page", Integer(1, MAX_PAGE, DEFAULT_PAGE), "Page number.", example=DEFAULT_PAGE)
LIMIT = Param("limit", PageSize(DEFAULT_LIMIT), "Items per page", example=2)
PAGING = (PAGE, LIMIT)
TYPE = Param(
    "type",
    Choice(TYPES),
    "in any case (e.g. cash); forwarded in upper case.",
    example_from=("expense", "type"),
)

USERS = Route(
    "users",
    "/users",
    UserPage,
    ttl_s=300,
    operation_id="listUsers",
    text="The organisation's users, a page at a time.",
    query=PAGING,
)
CLIENTS = Route(
    "clients",
    "/clients",
    ClientPage,
    ttl_s=300,
    operation_id="listClients",
    text="The clients and providers, a page at a time.",
    query=PAGING,
)
EXPENSES = Route(
    "expenses",
    "/expenses",
    ExpensePage,
    ttl_s=30,
    operation_id="listExpenses",
    text="The expenses, a page at a time, filtered by any combination of the query"
    " parameters. `dateFrom` must not be after `dateTo`: such a request is a 400"
    " naming both, and never reaches the upstream.",
    query=(
        *PAGING,
        Param(
            "dateFrom",
            Day(),
            "Only expenses issued on or after this day: a real calendar date YYYY-MM-DD,"
            " not after dateTo.",
            example_from=("expense", "issueDate"),
        ),
        Param(
            "dateTo",
            Day(),
            "Only expenses issued on or before this day: a real calendar date YYYY-MM-DD,"
            " not before dateFrom.",
            example_from=("expense", "issueDate"),
        ),
        Param(
            "amount",
            Amount(),
            "Only expenses of this amount: a finite decimal number such as 12.50, -3 or"
            " 1E2, at most 40 digits once written out; forwarded in plain notation"
            " (12.5, 100).",
            example_from=("expense", "amount"),
        ),
        Param(
            "concept",
            Text(),
            "Text searched in the expenses' description and category.",
            example_from=("expense", "category"),
        ),
        Param(
            "account",
            Text(),
            "Only expenses of this account, by id or name.",
            example_from=("expense", "account", "name"),
        ),
        Param(
            "status",
            Text(),
            "Only expenses with this status, e.g. PAID.",
            example_from=("expense", "status"),
        ),
        TYPE,
        Param(
            "user",
            Text(),
            "Only expenses of this user, by id or username.",
            example_from=("expense", "user", "username"),
        ),
    ),
    rules=(NotAfter("dateFrom", "dateTo"),),
    sample=(
        DaysAround("dateFrom", "dateTo", ("issueDate",)),
        First("amount", ("amount",), paged=False),
        Word("concept", ("description",)),
        First("account", ("account", "name")),
        Each("status", ("status",)),
        Each("type", ("type",), within=TYPES),
        # a username, and another user's id (of /users, else of the expenses' users)
        First("user", ("username",), of="users", otherwise=("user",)),
        First("user", ("id",), skip=1, of="users", otherwise=("user",)),
        Together((("status", ("status",)), ("type", ("type",)))),
        Together(
            (
                ("account", ("account", "name")),
                ("user", ("user", "username")),
                ("dateTo", ("issueDate",)),
            ),
            record=-1,
        ),
        Together((("status", ("status",)),), also=(("page", "2"),)),
    ),
)
EXPENSE = Route(
    "expense",
    "/expenses/{expenseId}",
    Expense,
    ttl_s=30,
    operation_id="getExpense",
    text="One expense, by its UUID.",
    path=Param(
        "expenseId",
        Uuid(),
        "The expense's UUID, in any case (the 32-hex-digit form without hyphens is"
        " accepted too); forwarded in lower-case canonical form.",
        example_from=("expense", "id"),
    ),
    listed_by="expenses",
    sample=(Spread("expenseId", ("id",), 5), Fixed("expenseId", (UNKNOWN_EXPENSE,))),
)
ACCOUNTS = Route(
    "accounts",
    "/accounts",
    AccountPage,
    ttl_s=60,
    operation_id="listAccounts",
    text="The cash and bank accounts, a page at a time.",
    query=(
        *PAGING,
        TYPE,
        Param(
            "bankCode",
            Text(),
            "Only accounts of the bank with this code.",
            example_from=("account", "bankCode"),
        ),
    ),
    sample=(
        Fixed("type", TYPES, paged=False),
        First("bankCode", ("bankCode",), paged=False),
        First("bankCode", ("bankCode",), paged=False, also=(("type", "BANK"),)),
    ),
)
ACCOUNT = Route(
    "account",
    "/accounts/{accountId}",
    Account,
    ttl_s=60,
    operation_id="getAccount",
    text="One account, by its id or its name.",
    path=Param(
        "accountId",
        Text(),
        "The account's id or name; percent-encode spaces, '/' and non-ASCII letters."
        " Forwarded percent-encoded as exactly one path segment.",
        example_from=("account", "id"),
    ),
    listed_by="accounts",
    sample=(
        First("accountId", ("id",), count=8),
        # by name too, escaped as one path segment
        First("accountId", ("name",), count=4, unless=("id",)),
        Fixed("accountId", (UNKNOWN_ACCOUNT,)),
    ),
)

ROUTES = RouteTable((USERS, CLIENTS, EXPENSES, EXPENSE, ACCOUNTS, ACCOUNT))
