"""The records of the reference upstream, generated deterministically from a seed.

``generate_dataset(seed)`` always returns the same records for the same seed: every
random choice is drawn from one ``random.Random(seed)`` in a fixed order, and the ids
(UUIDs) are drawn from it too. Nothing here knows about HTTP or JSON; see
``representations.py`` for the shapes the API sends.

Default sizes: 6 users, 50 clients and providers, 8 accounts (cash and bank, some with
ids that are not UUIDs and contain spaces, non-ASCII letters or a ``/``) and 2,000
expenses issued between 2024-01-01 and 2025-12-31 in five currencies.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

FIRST_ISSUE_DATE = date(2024, 1, 1)
LAST_ISSUE_DATE = date(2025, 12, 31)

_FOUR_PLACES = Decimal("0.0001")
_TWO_PLACES = Decimal("0.01")


@dataclass(frozen=True, slots=True)
class Bank:
    name: str
    country: int  # ISO 3166-1 numeric code
    code: str
    swift_code: str | None


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    name: str
    account_number: str
    description: str
    type: str  # CASH or BANK
    bank: Bank | None  # None for CASH accounts
    liquidity_threshold: Decimal  # two decimals
    last_balance: Decimal  # four decimals


@dataclass(frozen=True, slots=True)
class User:
    id: str
    username: str
    mail: str
    role: str
    phone: str
    account_names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Client:
    id: str
    name: str
    description: str
    vat_number: str
    type: str  # CLIENT or PROVIDER
    tax_retention_percentage: Decimal


@dataclass(frozen=True, slots=True)
class Expense:
    id: str
    payment_id: str
    currency_code: str
    amount: Decimal  # four decimals
    paid_at: datetime | None  # UTC; None unless status is PAID
    method: str
    description: str
    category: str
    issue_date: date
    due_date: date
    status: str  # PAID, PENDING or CANCELLED
    account: Account
    client: Client
    user: User

    @property
    def type(self) -> str:
        """CASH or BANK: always the type of the expense's account."""
        return self.account.type


@dataclass(frozen=True, slots=True)
class Dataset:
    """All records, in generation order (the API sorts them; see ``store.py``)."""

    seed: int
    users: tuple[User, ...]
    clients: tuple[Client, ...]
    accounts: tuple[Account, ...]
    expenses: tuple[Expense, ...]


_BANKS = {
    "bancolombia": Bank("Bancolombia", 170, "007", "COLOCOBM"),
    "bogota": Bank("Banco de Bogotá", 170, "001", "BBOGCOBB"),
    "davivienda": Bank("Davivienda", 170, "051", None),
    "santander_mx": Bank("Banco Santander México", 484, "014", "BMSXMXMM"),
    "bbva_es": Bank("BBVA España", 724, "0182", None),
}

# (id, name, account number, description, bank key or None for CASH, liquidity threshold)
_ACCOUNT_SPECS: tuple[tuple[str, str, str, str, str | None, str], ...] = (
    (
        "ACC-001",
        "Cuenta Corriente Principal",
        "0071234567",
        "Operating account",
        "bancolombia",
        "5000.00",
    ),
    ("ACC-002", "Cuenta Nómina", "0019876543", "Payroll account", "bogota", "2500.00"),
    (
        "BANCOLOMBIA_MAIN",
        "Bancolombia Recaudos",
        "0075550101",
        "Collections",
        "bancolombia",
        "10000.00",
    ),
    (
        "Caja chica Bogotá",
        "Caja chica Bogotá",
        "CAJA-BOG-01",
        "Petty cash, Bogotá office",
        None,
        "500.00",
    ),
    (
        "Cuenta Ñandú Ahorros",
        "Cuenta Ñandú Ahorros",
        "0514443322",
        "Savings account",
        "davivienda",
        "1500.00",
    ),
    ("Caja General", "Caja General", "CAJA-GEN-01", "Main cash box", None, "750.00"),
    (
        "SANTANDER-MX-01",
        "Santander MXN Operativa",
        "014180655501",
        "Mexico operations",
        "santander_mx",
        "20000.00",
    ),
    (
        "Tesorería EUR/USD",
        "Tesorería EUR/USD",
        "ES9101820001230201512345",
        "Treasury, foreign currency",
        "bbva_es",
        "3000.00",
    ),
)

_USER_SPECS: tuple[tuple[str, str], ...] = (
    ("admin", "ADMIN"),
    ("maria.gomez", "ACCOUNTANT"),
    ("jorge.ramirez", "ACCOUNTANT"),
    ("lucia.fernandez", "ACCOUNTANT"),
    ("andres.perez", "VIEWER"),
    ("sofia.munoz", "VIEWER"),
)

_CLIENT_STEMS = (
    "Andina", "Pacífico", "Cóndor", "Montaña", "Sabana", "Caribe", "Orinoco", "Magdalena",
    "Ñandú", "Quetzal", "Aurora", "Horizonte", "Ceiba", "Cafetal", "Volcán", "Llanos",
)  # fmt: skip
_CLIENT_TRADES = (
    "Logística", "Papelería", "Consultores", "Tecnología", "Alimentos", "Transportes",
    "Limpieza", "Seguridad", "Publicidad", "Construcciones",
)  # fmt: skip
_CLIENT_FORMS = ("S.A.S.", "Ltda.", "S.A.", "S.A. de C.V.", "& Cía.", "SL")
_TAX_RETENTIONS = ("0", "1", "2.5", "4", "6", "10", "11", "15", "19")

_CURRENCIES = ("COP", "USD", "EUR", "MXN", "GBP")
_CURRENCY_WEIGHTS = (40, 20, 15, 15, 10)
_BANK_METHODS = ("TRANSFER", "TRANSFER", "CARD", "DIRECT_DEBIT")

# (category, descriptions)
_CONCEPTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Rent", ("Arriendo oficina", "Arriendo bodega", "Parqueadero mensual")),
    ("Utilities", ("Servicio de energía", "Servicio de agua", "Internet y telefonía")),
    ("Office supplies", ("Papelería", "Tóner impresora", "Útiles de aseo")),
    ("Professional services", ("Honorarios contables", "Asesoría jurídica", "Auditoría externa")),
    ("Software", ("Licencias de software", "Hosting y dominios", "Suscripción CRM")),
    ("Travel", ("Tiquetes aéreos", "Hotel viaje comercial", "Viáticos")),
    ("Meals", ("Almuerzo de equipo", "Café y refrigerios", "Cena con cliente")),
    ("Maintenance", ("Mantenimiento equipos", "Reparación aire acondicionado", "Pintura sede")),
    ("Transport", ("Mensajería", "Taxi y transporte", "Fletes")),
    ("Taxes", ("Impuesto predial", "Retención en la fuente", "ICA bimestral")),
)


def generate_dataset(
    seed: int = 42,
    *,
    n_clients: int = 50,
    n_expenses: int = 2000,
) -> Dataset:
    """Generate every record from ``seed``; the same arguments give equal datasets."""
    rng = random.Random(seed)
    accounts = _make_accounts(rng)
    users = _make_users(rng, accounts)
    clients = _make_clients(rng, n_clients)
    expenses = _make_expenses(rng, n_expenses, accounts, users, clients)
    return Dataset(seed=seed, users=users, clients=clients, accounts=accounts, expenses=expenses)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _make_accounts(rng: random.Random) -> tuple[Account, ...]:
    accounts = []
    for account_id, name, number, description, bank_key, threshold in _ACCOUNT_SPECS:
        balance = Decimal(rng.randint(-50_000, 50_000_000)) / 100
        accounts.append(
            Account(
                id=account_id,
                name=name,
                account_number=number,
                description=description,
                type="CASH" if bank_key is None else "BANK",
                bank=None if bank_key is None else _BANKS[bank_key],
                liquidity_threshold=Decimal(threshold).quantize(_TWO_PLACES),
                last_balance=balance.quantize(_FOUR_PLACES),
            )
        )
    return tuple(accounts)


def _make_users(rng: random.Random, accounts: tuple[Account, ...]) -> tuple[User, ...]:
    names = [account.name for account in accounts]
    users = []
    for username, role in _USER_SPECS:
        if role == "ADMIN":
            granted = names
        else:
            granted = sorted(rng.sample(names, rng.randint(2, 5)), key=names.index)
        users.append(
            User(
                id=_uuid(rng),
                username=username,
                mail=f"{username}@example.com",
                role=role,
                phone=f"+57 3{rng.randint(0, 2)}{rng.randint(0, 9)} "
                f"{rng.randint(100, 999)} {rng.randint(1000, 9999)}",
                account_names=tuple(granted),
            )
        )
    return tuple(users)


def _make_clients(rng: random.Random, count: int) -> tuple[Client, ...]:
    clients: list[Client] = []
    seen: set[str] = set()
    while len(clients) < count:
        stem, trade = rng.choice(_CLIENT_STEMS), rng.choice(_CLIENT_TRADES)
        name = f"{trade} {stem} {rng.choice(_CLIENT_FORMS)}"
        if name.casefold() in seen:
            continue
        seen.add(name.casefold())
        kind = "PROVIDER" if rng.random() < 0.6 else "CLIENT"
        relation = "Proveedor" if kind == "PROVIDER" else "Cliente"
        clients.append(
            Client(
                id=_uuid(rng),
                name=name,
                description=f"{relation} de {trade.lower()}",
                vat_number=f"{rng.randint(800_000_000, 999_999_999)}-{rng.randint(0, 9)}",
                type=kind,
                tax_retention_percentage=Decimal(rng.choice(_TAX_RETENTIONS)),
            )
        )
    return tuple(clients)


def _make_expenses(
    rng: random.Random,
    count: int,
    accounts: tuple[Account, ...],
    users: tuple[User, ...],
    clients: tuple[Client, ...],
) -> tuple[Expense, ...]:
    users_of_account = {
        account.name: [user for user in users if account.name in user.account_names]
        for account in accounts
    }
    span_days = (LAST_ISSUE_DATE - FIRST_ISSUE_DATE).days
    expenses = []
    for number in range(1, count + 1):
        account = rng.choice(accounts)
        issue_date = FIRST_ISSUE_DATE + timedelta(days=rng.randint(0, span_days))
        due_date = issue_date + timedelta(days=rng.choice((0, 15, 30, 30, 45, 60)))
        roll = rng.random()
        status = "PAID" if roll < 0.8 else "PENDING" if roll < 0.95 else "CANCELLED"
        paid_at = None
        if status == "PAID":
            paid_day = issue_date + timedelta(days=rng.randint(0, (due_date - issue_date).days))
            clock = time(rng.randint(7, 19), rng.choice((0, 15, 30, 45)), rng.randint(0, 59))
            paid_at = datetime.combine(paid_day, clock, tzinfo=UTC)
        currency = rng.choices(_CURRENCIES, _CURRENCY_WEIGHTS)[0]
        if currency == "COP":
            amount = Decimal(rng.randint(5, 20_000) * 1000)
        else:
            amount = Decimal(rng.randint(500, 2_000_000)) / 100
        category, descriptions = rng.choice(_CONCEPTS)
        expenses.append(
            Expense(
                id=_uuid(rng),
                payment_id=f"PAY-{issue_date.year}-{number:06d}",
                currency_code=currency,
                amount=amount.quantize(_FOUR_PLACES),
                paid_at=paid_at,
                method="CASH" if account.type == "CASH" else rng.choice(_BANK_METHODS),
                description=rng.choice(descriptions),
                category=category,
                issue_date=issue_date,
                due_date=due_date,
                status=status,
                account=account,
                client=rng.choice(clients),
                user=rng.choice(users_of_account[account.name]),
            )
        )
    return tuple(expenses)
